"""Worker identity on env hosts: ids (and so seeds) every host of a job agrees on."""

from __future__ import annotations

from pathlib import Path

from hetrl.launch.cluster import ClusterView
from hetrl.launch.env_host import _worker_id


def view(current: str, groups: dict[str, list[str]]) -> ClusterView:
    return ClusterView(current_host=current, current_group="env_group", groups=groups,
                       instance_types={}, is_hetero=True, base_dir=Path("/opt/ml"),
                       model_dir=Path("/opt/ml/model"), output_dir=Path("/opt/ml/output"),
                       num_cpus=2, num_gpus=0, hyperparameters={})


def test_worker_ids_do_not_depend_on_the_order_a_host_sees_the_hosts_in() -> None:
    # Each env host reads its own resourceconfig.json; the group lists need not agree
    # in order (the design brief: "Group host lists are not sorted").
    on_algo_3 = {"learner_group": ["algo-2"], "env_group": ["algo-3", "algo-10"]}
    on_algo_10 = {"learner_group": ["algo-2"], "env_group": ["algo-10", "algo-3"]}
    ids_3 = [_worker_id(view("algo-3", on_algo_3), i) for i in range(2)]
    ids_10 = [_worker_id(view("algo-10", on_algo_10), i) for i in range(2)]
    assert not set(ids_3) & set(ids_10), (ids_3, ids_10)  # were 1000, 1001 on both
    # Natural order (algo-2 < algo-3 < algo-10), the same from either host's view.
    assert ids_3 == [1000, 1001] and ids_10 == [2000, 2001]
