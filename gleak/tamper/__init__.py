"""Global models a malicious server crafted (issue 46; notes in docs/methods/server.md).

- :mod:`~gleak.tamper.views`: every weight as a neuron-major matrix (rows = neurons) with its bias.
- :mod:`~gleak.tamper.structure`: the weight-only tests (duplicate and constant rows, trap-weight pairing,
  input-passing kernels, extreme biases, zeroed embedding columns), each a :class:`~gleak.tamper.structure.Hit`.
- :mod:`~gleak.tamper.craft`: the published crafts (imprint, trap weights, class fishing), to build cases and to
  measure what a tampered model takes.
- :mod:`~gleak.tamper.imprint`: the server's closed-form inversion of an imprinted layer's update.

This layer sits beside the attacks: it imports torch and gleak's errors only.
"""
