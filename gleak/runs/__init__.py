"""The use-case layer: one module per run, typed inputs in, a typed report out, no printing.

- ``gleak labels``: :func:`gleak.runs.labels.run_labels` with a :class:`~gleak.runs.labels.LabelsRequest`
- ``gleak reconstruct``: :func:`gleak.runs.reconstruct.run_reconstruct`, then
  :func:`~gleak.runs.reconstruct.write_outputs`
- ``gleak audit``: :func:`gleak.runs.audit.run_audit`; a capture in memory: :func:`gleak.runs.audit.audit_loaded`
- ``gleak inspect``: :func:`gleak.runs.inspect.run_inspect`
- ``gleak simulate``: :func:`gleak.runs.simulate.run_simulate`
- ``gleak train-generator``: :func:`gleak.runs.train_generator.run_train_generator`
- ``gleak attacks``: :func:`gleak.runs.attacks.describe_attacks`

Every run opens its inputs through :mod:`gleak.runs.inputs` and scores through :mod:`gleak.runs.scoring`. This
package imports none of its modules, so a command loads only the run it calls."""
