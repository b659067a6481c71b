"""A two-round NVFlare job for NVFlare's simulator (tests/test_nvflare.py, marked integration): a controller that
sends the global weights with each ``train`` task, an executor that answers with a ``WEIGHT_DIFF``, and gleak's
capture filter in the site's task-data and task-result chains, as docs/pipelines.md adds them with the Job API.

Run as a script (``python tests/nvflare_sim_job.py OUT WORKSPACE``) so that the simulator's processes import this
module by its file (the Job API copies it into the job's ``custom`` folder)."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
from nvflare.apis.dxo import DXO, DataKind, MetaKey, from_shareable
from nvflare.apis.executor import Executor
from nvflare.apis.impl.controller import Controller, Task

GLOBAL = {"fc.weight": np.ones((3, 4), dtype=np.float32), "fc.bias": np.zeros(3, dtype=np.float32)}
ROUNDS = 2


class TwoRounds(Controller):  # type: ignore[misc]
    """Round r: the global weights (round r in the DXO's meta) to every site; the global model adds the diff."""

    def start_controller(self, fl_ctx: Any) -> None:
        pass

    def stop_controller(self, fl_ctx: Any) -> None:
        pass

    def process_result_of_unknown_task(self, *args: Any) -> None:
        pass

    def control_flow(self, abort_signal: Any, fl_ctx: Any) -> None:
        state = {k: v.copy() for k, v in GLOBAL.items()}
        for rnd in range(1, ROUNDS + 1):
            task = Task(name="train", data=DXO(DataKind.WEIGHTS, state, meta={MetaKey.CURRENT_ROUND: rnd})
                        .to_shareable())
            self.broadcast_and_wait(task=task, min_responses=1, fl_ctx=fl_ctx, abort_signal=abort_signal)
            diff = from_shareable(task.client_tasks[0].result).data
            state = {k: state[k] + diff[k] for k in state}


class Trainer(Executor):  # type: ignore[misc]
    """A fixed update of 0.1 per entry, 3 local steps, the task's round passed on."""

    def execute(self, task_name: str, shareable: Any, fl_ctx: Any, abort_signal: Any) -> Any:
        dxo = from_shareable(shareable)
        diff = {k: np.full_like(v, 0.1) for k, v in dxo.data.items()}
        meta = {MetaKey.NUM_STEPS_CURRENT_ROUND: 3, MetaKey.CURRENT_ROUND: dxo.get_meta_prop(MetaKey.CURRENT_ROUND)}
        return DXO(DataKind.WEIGHT_DIFF, diff, meta=meta).to_shareable()


def main(out: str, workspace: str) -> None:
    from nvflare.job_config.api import FedJob
    from nvflare.job_config.defs import FilterType

    from gleak.integrations.nvflare import GleakCaptureFilter

    job = FedJob(name="gleak_sim", min_clients=1)
    job.to_server(TwoRounds())
    job.to(Trainer(), "site-1", tasks=["train"])
    job.to(GleakCaptureFilter(out), "site-1", filter_type=FilterType.TASK_DATA, tasks=["train"])
    job.to(GleakCaptureFilter(out, learning_rate=0.01), "site-1", filter_type=FilterType.TASK_RESULT,
           tasks=["train"])
    job.simulator_run(workspace, threads=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
