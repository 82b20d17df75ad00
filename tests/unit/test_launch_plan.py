"""mgpu launch options -> torchrun arguments, with the GPU count, the environment and the port check faked."""

from __future__ import annotations

import os
import re
import shlex

import pytest

from mgpucli.errors import UsageError
from mgpucli.launch.plan import (
    DEFAULT_JOIN_TIMEOUT_S,
    WORKER_MODULE,
    LaunchOptions,
    Machine,
    RecipeFacts,
    build_plan,
    check_job_options,
    script_facts,
    worker_args,
)
from mgpucli.launch.script import ScriptTarget


def machine(gpus: int = 0, cores: int = 8, **env: str) -> Machine:
    return Machine(visible_gpus=gpus, cpu_count=cores, hostname="box", environ=env)


FACTS = RecipeFacts(run_dir="runs/q")


def plan_for(machine_=None, facts=FACTS, busy=(), unknown_hosts=(), **opts):
    checked: list[int] = []
    resolved: list[tuple[str, float]] = []

    def port_check(port: int):
        checked.append(port)
        return "already in use on this machine" if port in busy else None

    def host_check(host: str, wait_s: float):
        resolved.append((host, wait_s))
        return "does not resolve (Name or service not known)" if host in unknown_hosts else None

    plan = build_plan(LaunchOptions(recipe="r.yaml", **opts), facts, machine_ or machine(),
                      port_check=port_check, new_id=lambda: "mgpu-fresh", host_check=host_check)
    plan.checked_ports = checked  # type: ignore[attr-defined]
    plan.resolved = resolved  # type: ignore[attr-defined]
    return plan


def arg(plan, name: str) -> str | None:
    args = plan.torchrun_args[: plan.torchrun_args.index("-m")]
    return args[args.index(name) + 1] if name in args else None


def usage_error(**kw) -> str:
    with pytest.raises(UsageError) as info:
        plan_for(**kw)
    return str(info.value)


# ---------------------------------------------------------------------------------------------- CPU
def test_cpu_workers_get_standalone_rendezvous_and_a_share_of_the_cores():
    plan = plan_for(machine(cores=8), cpu=True, nproc=2)
    assert arg(plan, "--nproc-per-node") == "2"
    assert arg(plan, "--nnodes") == "1"
    assert arg(plan, "--rdzv-backend") == "c10d"
    assert arg(plan, "--rdzv-endpoint") == "localhost:0"  # the OS picks a free port
    assert arg(plan, "--rdzv-id") == "mgpu-fresh"
    assert plan.env["OMP_NUM_THREADS"] == "4"  # 8 cores / 2 processes, not torchrun's 1
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in plan.env  # no restarts: torch's shared store, no backoff
    restarting = plan_for(machine(cores=8), cpu=True, nproc=2, max_restarts=1)
    assert restarting.env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    assert plan.torchrun_args[-len(plan.worker_args) - 2:] == ["-m", WORKER_MODULE, *plan.worker_args]
    assert plan.worker_args == ["train", "r.yaml", "trainer.device=cpu"]
    assert plan.checked_ports == []  # nothing to check: port 0


def test_cpu_threads_respect_the_user_and_the_recipe():
    assert "OMP_NUM_THREADS" not in plan_for(machine(cores=8, OMP_NUM_THREADS="3"), cpu=True, nproc=2).env
    facts = RecipeFacts(run_dir="runs/q", cpu_threads=1)
    assert plan_for(machine(cores=8), facts=facts, cpu=True, nproc=2).env["OMP_NUM_THREADS"] == "1"
    assert plan_for(machine(cores=1), cpu=True, nproc=4).env["OMP_NUM_THREADS"] == "1"  # never 0


def test_cpu_defaults_to_one_process_and_recipe_device_cpu_means_cpu():
    assert plan_for(cpu=True).nproc_per_node == 1
    plan = plan_for(machine(gpus=4), facts=RecipeFacts(run_dir="runs/q", device="cpu"), nproc=2)
    assert plan.devices.kind == "cpu" and plan.nproc_per_node == 2
    assert "trainer.device=cpu" not in plan.worker_args  # the recipe says so already


def test_cpu_override_conflict_and_no_duplicate():
    assert "conflicts" in usage_error(cpu=True, overrides=("trainer.device=cuda",))
    plan = plan_for(cpu=True, overrides=("trainer.device=cpu",))
    assert plan.worker_args.count("trainer.device=cpu") == 1


def test_train_options_pass_through_to_every_worker():
    opts = LaunchOptions(recipe="r.yaml", overrides=("optim.lr=0.1",), cpu=True, resume="auto", overwrite=True)
    assert worker_args(opts) == ["train", "r.yaml", "optim.lr=0.1", "trainer.device=cpu", "--resume", "auto",
                                 "--overwrite"]
    probe = LaunchOptions(recipe="r.yaml", probe_steps=5, probe_result="/tmp/x.json")
    assert worker_args(probe) == ["train", "r.yaml", "--probe", "--probe-steps", "5", "--probe-result", "/tmp/x.json"]


# ---------------------------------------------------------------------------------------------- GPUs
def test_no_gpus_option_means_all_visible_gpus():
    plan = plan_for(machine(gpus=4))
    assert plan.nproc_per_node == 4 and plan.devices.gpu_indices == (0, 1, 2, 3)
    assert "CUDA_VISIBLE_DEVICES" not in plan.env and "OMP_NUM_THREADS" not in plan.env
    assert "trainer.device=cpu" not in plan.worker_args


@pytest.mark.parametrize(
    ("gpus", "visible_env", "nproc", "cvd"),
    [
        ("2", None, 2, "0,1"),
        ("all", None, 4, "0,1,2,3"),
        ("0,2,3", None, 3, "0,2,3"),
        ("1,", None, 1, "1"),
        ("1,3", "4,5,6,7", 2, "5,7"),  # indices among the visible GPUs map through the user's list
        ("1,", "GPU-aaaa,GPU-bbbb,GPU-cccc,GPU-dddd", 1, "GPU-bbbb"),
    ],
)
def test_gpu_lists_and_cuda_visible_devices_mapping(gpus, visible_env, nproc, cvd):
    env = {"CUDA_VISIBLE_DEVICES": visible_env} if visible_env else {}
    plan = plan_for(machine(gpus=4, **env), gpus=gpus)
    assert arg(plan, "--nproc-per-node") == str(nproc)
    assert plan.env["CUDA_VISIBLE_DEVICES"] == cvd


@pytest.mark.parametrize(
    ("kw", "expected"),
    [
        ({"gpus": "8"}, "more GPUs than the 4 visible"),
        ({"gpus": "0,5"}, "GPU 5 does not exist (visible: 0..3)"),
        ({"gpus": "1,1"}, "more than once"),
        ({"gpus": "two"}, "is not a GPU count"),
        ({"gpus": "0"}, "--gpus 0, (with the comma)"),
        ({"gpus": "2", "cpu": True}, "--cpu and --gpus exclude each other"),
        ({"cpu": True, "nproc": 0}, "at least 1"),
        ({"nproc": 2}, "needs --cpu"),
    ],
)
def test_bad_gpu_options_exit_2_with_what_is_visible(kw, expected):
    message = usage_error(machine_=machine(gpus=4), **kw)
    assert expected in message


def test_no_cuda_suggests_cpu_workers():
    for kw in ({}, {"gpus": "2"}):
        message = usage_error(machine_=machine(gpus=0), **kw)
        assert "no CUDA GPU" in message and "--cpu --nproc N" in message


def test_invalid_cuda_visible_devices_is_bad_input():
    message = usage_error(machine_=machine(gpus=1, CUDA_VISIBLE_DEVICES="0,0"), gpus="1")
    assert "CUDA_VISIBLE_DEVICES" in message


def test_recipe_cpu_with_gpus_is_a_conflict():
    assert "trainer.device=cpu" in usage_error(machine_=machine(gpus=2), facts=RecipeFacts(run_dir="r", device="cpu"),
                                               gpus="2")


def test_dp_is_one_process_spanning_the_selected_gpus():
    facts = RecipeFacts(run_dir="runs/q", strategy="dp")
    plan = plan_for(machine(gpus=4), facts=facts, gpus="0,2")
    assert plan.nproc_per_node == 1 and plan.env["CUDA_VISIBLE_DEVICES"] == "0,2"
    assert "one process" in usage_error(facts=facts, cpu=True, nproc=2)
    assert "one device" in usage_error(machine_=machine(gpus=2), facts=RecipeFacts(run_dir="r", strategy="single"))


# --------------------------------------------------------------------------------------------- ports
def test_master_port_is_bound_tested_and_used_for_a_static_rendezvous():
    plan = plan_for(cpu=True, nproc=2, master_port=29611)
    assert plan.checked_ports == [29611]
    assert (arg(plan, "--rdzv-backend"), arg(plan, "--master-addr"), arg(plan, "--master-port")) == (
        "static", "127.0.0.1", "29611")
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in plan.env


def test_busy_master_port_is_exit_2_naming_the_port():
    message = usage_error(cpu=True, master_port=29612, busy=(29612,))
    assert "--master-port 29612" in message and "already in use" in message


@pytest.mark.parametrize("port", [0, 70000])
def test_master_port_out_of_range(port):
    assert "1 to 65535" in usage_error(cpu=True, master_port=port)


def test_single_node_rdzv_endpoint_port_is_checked_too():
    assert "in use" in usage_error(cpu=True, rdzv_endpoint="localhost:29613", busy=(29613,))
    assert "--rdzv-endpoint 'localhost' is not HOST:PORT" in usage_error(cpu=True, rdzv_endpoint="localhost")


def test_master_addr_alone_on_one_node_is_refused():
    assert "--master-port" in usage_error(cpu=True, master_addr="10.0.0.1")


# ---------------------------------------------------------------------------------------- multi-node
def test_static_multi_node_node0_checks_the_port_others_do_not():
    common = {"cpu": True, "nnodes": 2, "master_addr": "10.1.1.1", "master_port": 29700}
    node0 = plan_for(node_rank=0, **common)
    node1 = plan_for(node_rank=1, **common)
    assert node0.checked_ports == [29700] and node1.checked_ports == []
    assert arg(node1, "--node-rank") == "1" and arg(node1, "--nnodes") == "2"
    assert arg(node0, "--rdzv-id") == arg(node1, "--rdzv-id") != "mgpu-fresh"  # both nodes agree
    assert node0.launch_json.endswith("launch.json") and node1.launch_json.endswith("launch.node1.json")
    other = plan_for(node_rank=0, **{**common, "master_port": 29701})
    assert arg(other, "--rdzv-id") != arg(node0, "--rdzv-id")  # another job, another id


def test_static_multi_node_needs_address_and_node_rank():
    assert "--master-addr" in usage_error(cpu=True, nnodes=2)
    assert "--node-rank" in usage_error(cpu=True, nnodes=2, master_addr="10.1.1.1")
    assert "does not fit --nnodes 2" in usage_error(cpu=True, nnodes=2, master_addr="h", node_rank=2)
    assert "does not fit --nnodes 1" in usage_error(cpu=True, node_rank=1)  # the default count, said as a number
    assert "at least 1" in usage_error(cpu=True, nnodes=0)


def test_default_static_port_is_torchruns():
    plan = plan_for(cpu=True, nnodes=2, master_addr="10.1.1.1", node_rank=1)
    assert arg(plan, "--master-port") == "29500"


def test_c10d_multi_node_and_exclusive_with_static():
    plan = plan_for(cpu=True, nnodes=2, rdzv_endpoint="node01:29400")
    assert (arg(plan, "--rdzv-backend"), arg(plan, "--rdzv-endpoint")) == ("c10d", "node01:29400")
    assert arg(plan, "--rdzv-id").startswith("mgpu-") and arg(plan, "--rdzv-id") != "mgpu-fresh"
    assert plan.checked_ports == []  # another node may already host the store
    assert re.fullmatch(r"launch\.box-[0-9a-f]{6}\.json", os.path.basename(plan.launch_json))  # c10d ranks the nodes
    ranked = plan_for(cpu=True, nnodes=2, rdzv_endpoint="node01:29400", node_rank=1)
    assert re.fullmatch(r"launch\.box-[0-9a-f]{6}\.json", os.path.basename(ranked.launch_json))  # rank given or not
    assert ranked.launch_json != plan_for(cpu=True, nnodes=2, rdzv_endpoint="node01:29400").launch_json  # same host
    assert arg(plan_for(cpu=True, nnodes=2, rdzv_endpoint="n:1", rdzv_id="job7"), "--rdzv-id") == "job7"
    assert "exclude each other" in usage_error(cpu=True, nnodes=2, rdzv_endpoint="n:1", master_port=2)


def test_the_run_id_comes_from_the_job_never_from_what_the_nodes_run():
    """Nodes whose recipes differ must still meet (and then be told how they differ): the id is the job's."""
    common = {"cpu": True, "nnodes": 2, "master_addr": "10.1.1.1", "master_port": 29700, "node_rank": 1}
    plain = plan_for(**common)
    changed = build_plan(LaunchOptions(recipe="other.yaml", overrides=("optim.lr=0.2",), **common),
                         RecipeFacts(run_dir="runs/elsewhere"), machine(), port_check=lambda port: None,
                         new_id=lambda: "mgpu-fresh", host_check=lambda host, wait: None)
    assert arg(changed, "--rdzv-id") == arg(plain, "--rdzv-id") != "mgpu-fresh"
    assert arg(plan_for(**{**common, "nnodes": 3}), "--rdzv-id") != arg(plain, "--rdzv-id")  # another node count
    c10d = {"cpu": True, "nnodes": 2, "rdzv_endpoint": "node01:29400"}
    assert arg(plan_for(**c10d), "--rdzv-id") == arg(plan_for(**c10d, facts=RecipeFacts(run_dir="x")), "--rdzv-id")
    assert arg(plan_for(**c10d, rdzv_id="job7"), "--rdzv-id") == "job7"  # --rdzv-id wins
    pet = machine(PET_NNODES="2", PET_RDZV_ENDPOINT="job-worker-0:29400", PET_RDZV_ID="myjob")
    assert arg(plan_for(pet, cpu=True), "--rdzv-id") == "myjob"
    assert arg(plan_for(machine(gpus=2, **SLURM)), "--rdzv-id") == "slurm-4321"


def test_the_join_timeout_is_the_default_or_given_and_refused_on_one_node():
    common = {"cpu": True, "nnodes": 2, "master_addr": "10.1.1.1", "master_port": 29700, "node_rank": 1}
    plan = plan_for(**common)
    assert plan.join_timeout == DEFAULT_JOIN_TIMEOUT_S and arg(plan, "--rdzv-conf") == "timeout=600"
    c10d = plan_for(cpu=True, nnodes=2, rdzv_endpoint="node01:29400", join_timeout=90)
    assert c10d.join_timeout == 90 and arg(c10d, "--rdzv-conf") == "join_timeout=90"  # torchrun's own spelling
    assert plan_for(cpu=True).join_timeout is None and arg(plan_for(cpu=True), "--rdzv-conf") is None
    assert "is for jobs of several nodes" in usage_error(cpu=True, join_timeout=30)
    assert "above 0" in usage_error(join_timeout=0, **common)


# --------------------------------------------------------------------------------------------- SLURM
SLURM = {"SLURM_JOB_ID": "4321", "SLURM_NNODES": "3", "SLURM_JOB_NODELIST": "gpu[07-09]",
         "SLURMD_NODENAME": "gpu08", "SLURM_NODEID": "1"}


def test_slurm_fills_nodes_rank_and_master():
    plan = plan_for(machine(gpus=2, **SLURM))
    assert (arg(plan, "--nnodes"), arg(plan, "--node-rank")) == ("3", "1")
    assert (arg(plan, "--master-addr"), arg(plan, "--master-port")) == ("gpu07", str(10000 + 4321))
    assert arg(plan, "--rdzv-id") == "slurm-4321"
    assert "SIGUSR1" in arg(plan, "--signals-to-handle")
    assert plan.checked_ports == []  # node 1 does not host the store
    assert any("SLURM job 4321" in n for n in plan.notes)


def test_slurm_values_yield_to_the_users():
    plan = plan_for(machine(gpus=2, **SLURM), nnodes=2, node_rank=0, master_addr="10.0.0.9", master_port=29800)
    assert (arg(plan, "--nnodes"), arg(plan, "--node-rank"), arg(plan, "--master-addr"),
            arg(plan, "--master-port")) == ("2", "0", "10.0.0.9", "29800")
    assert plan.checked_ports == [29800]


def test_a_slurm_node_rank_past_the_node_count_is_refused_with_both_values():
    env = {**SLURM, "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "gpu[07-08]", "SLURMD_NODENAME": "x",
           "SLURM_NODEID": "2"}
    assert "SLURM's node rank 2 is not below SLURM's node count 2" in usage_error(machine_=machine(gpus=2, **env))
    one = {**env, "SLURM_NNODES": "1", "SLURM_JOB_NODELIST": "gpu08"}  # a one-node step on the job's second node
    assert arg(plan_for(machine(gpus=2, **one)), "--nnodes") == "1"


def test_slurm_single_node_is_standalone():
    env = {"SLURM_JOB_ID": "5", "SLURM_NNODES": "1", "SLURM_JOB_NODELIST": "gpu01"}
    plan = plan_for(machine(gpus=2, **env))
    assert arg(plan, "--rdzv-endpoint") == "localhost:0" and arg(plan, "--nnodes") == "1"


# --------------------------------------------------------------------- Kubernetes: torchrun's PET_*, the pod's
PET = {"PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_NPROC_PER_NODE": "2", "PET_MASTER_ADDR": "job-master-0",
       "PET_MASTER_PORT": "23456", "MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456", "WORLD_SIZE": "2",
       "RANK": "1"}


def test_pet_variables_fill_the_nodes_rank_master_and_processes():
    plan = plan_for(machine(**PET), cpu=True)
    assert [arg(plan, o) for o in ("--nnodes", "--node-rank", "--nproc-per-node", "--master-addr", "--master-port")] \
        == ["2", "1", "2", "job-master-0", "23456"]
    assert arg(plan, "--rdzv-backend") == "static" and plan.checked_ports == []  # node 1 hosts no store
    assert plan.resolved == [("job-master-0", 60.0)]  # a pod's DNS name may appear late: waited for
    note = next(n for n in plan.notes if "PET_" in n)
    assert "PET_NODE_RANK=1" in note and "PET_NPROC_PER_NODE=2" in note and "2 nodes, node 1" in note
    assert plan.launch_json.endswith("launch.node1.json")
    node0 = plan_for(machine(**{**PET, "PET_NODE_RANK": "0"}), cpu=True)
    assert node0.checked_ports == [23456] and arg(node0, "--rdzv-id") == arg(plan, "--rdzv-id")  # both agree


def test_options_win_over_the_pet_variables():
    plan = plan_for(machine(**PET), cpu=True, nproc=2, nnodes=3, node_rank=2, master_addr="10.0.0.5",
                    master_port=29001)
    assert [arg(plan, o) for o in ("--nnodes", "--node-rank", "--master-addr", "--master-port")] == \
        ["3", "2", "10.0.0.5", "29001"]
    assert plan.resolved == [("10.0.0.5", 0.0)]  # typed by the user: tried once


def test_pet_nproc_is_the_gpu_count_and_auto_means_every_gpu():
    plan = plan_for(machine(gpus=4, **PET))
    assert arg(plan, "--nproc-per-node") == "2" and plan.env["CUDA_VISIBLE_DEVICES"] == "0,1"
    auto = plan_for(machine(gpus=4, **{**PET, "PET_NPROC_PER_NODE": "auto"}))
    assert arg(auto, "--nproc-per-node") == "4"
    assert "PET_NPROC_PER_NODE=cpu" in usage_error(machine_=machine(**{**PET, "PET_NPROC_PER_NODE": "cpu"}), cpu=True)
    too_many = usage_error(machine_=machine(gpus=1, **PET))
    assert too_many.startswith("PET_NPROC_PER_NODE=2 (processes per node): --gpus 2") and "1 visible" in too_many


@pytest.mark.parametrize(("kw", "given"), [({"cpu": True, "nproc": 1}, "--nproc 1"),
                                           ({"gpus": "1,2,3"}, "--gpus 1,2,3")])
def test_a_process_count_that_disagrees_with_pet_nproc_is_refused(kw, given):
    message = usage_error(machine_=machine(gpus=4, **PET), **kw)
    assert given in message and "PET_NPROC_PER_NODE=2" in message


def test_a_node_rank_not_below_the_node_count_is_refused_naming_both():
    message = usage_error(machine_=machine(**{**PET, "PET_NODE_RANK": "2"}), cpu=True)
    assert "PET_NODE_RANK=2 is not below PET_NNODES=2" in message
    assert "PET_NODE_RANK=2 is not below --nnodes 2" in usage_error(
        machine_=machine(**{**PET, "PET_NODE_RANK": "2", "PET_NNODES": "5"}), cpu=True, nnodes=2)


def test_a_port_out_of_range_is_refused_naming_the_variable():
    assert "PET_MASTER_PORT 70000: a TCP port" in usage_error(machine_=machine(**{**PET, "PET_MASTER_PORT": "70000"}),
                                                            cpu=True)


def test_a_master_that_does_not_resolve_is_refused_naming_the_variable():
    message = usage_error(machine_=machine(**PET), cpu=True, unknown_hosts=("job-master-0",))
    assert "PET_MASTER_ADDR=job-master-0" in message and "does not resolve" in message
    assert "--master-addr nohost" in usage_error(cpu=True, nnodes=2, node_rank=1, master_addr="nohost",
                                                 unknown_hosts=("nohost",))


def test_the_pods_variables_alone_make_a_job_inside_a_pod_only():
    pod = {k: v for k, v in PET.items() if not k.startswith("PET_")}
    plain = plan_for(machine(**pod), cpu=True)  # a shell's leftovers, or a worker's own variables
    assert arg(plain, "--nnodes") == "1" and arg(plain, "--rdzv-endpoint") == "localhost:0"
    plan = plan_for(machine(KUBERNETES_SERVICE_HOST="10.96.0.1", **pod), cpu=True, nproc=2)
    assert [arg(plan, o) for o in ("--nnodes", "--node-rank", "--master-addr")] == ["2", "1", "job-master-0"]
    assert any("the pod's variables" in n and "WORLD_SIZE=2" in n for n in plan.notes)


def test_a_c10d_endpoint_from_the_environment():
    env = {"PET_NNODES": "2", "PET_RDZV_BACKEND": "c10d", "PET_RDZV_ENDPOINT": "job-worker-0:29400",
           "PET_RDZV_ID": "myjob"}
    plan = plan_for(machine(**env), cpu=True)
    assert (arg(plan, "--rdzv-backend"), arg(plan, "--rdzv-endpoint"), arg(plan, "--rdzv-id")) == \
        ("c10d", "job-worker-0:29400", "myjob")
    assert plan.resolved == [("job-worker-0", 60.0)]
    static = plan_for(machine(**env), cpu=True, master_addr="10.0.0.1", node_rank=0)  # the options win, whole
    assert arg(static, "--rdzv-backend") == "static"


def test_the_world_size_launch_check_checks_the_recipe_for_counts_the_pods():
    from mgpucli.launch.plan import cpu_world_size

    assert cpu_world_size(LaunchOptions(recipe="r", cpu=True), PET) == 4  # PET_NNODES=2 x PET_NPROC_PER_NODE=2
    assert cpu_world_size(LaunchOptions(recipe="r", cpu=True, nproc=3, nnodes=1), {}) == 3
    assert cpu_world_size(LaunchOptions(recipe="r"), PET) is None  # GPUs: the workers check it


def test_a_scripts_run_dir_is_named_from_the_job_alike_on_every_pod():
    named: list = []
    for rank in ("0", "1"):
        script_plan(machine(**{**PET, "PET_NODE_RANK": rank}), cpu=True, named=named)
    assert named[0] == named[1] and named[0][0] == 2 and named[0][1] != "mgpu-fresh"


def test_torchrun_variables_mgpu_does_not_read_are_named_and_kept_from_torchruns_parser(monkeypatch, tmp_path):
    from mgpucli.launch.runner import parse_torchrun_options

    plan = plan_for(machine(**PET, PET_MAX_RESTARTS="3"), cpu=True)
    assert any("Not read by mgpu" in n and "PET_MAX_RESTARTS=3" in n for n in plan.notes)
    for key, value in {**PET, "PET_MAX_RESTARTS": "3", "PET_RDZV_ENDPOINT": "elsewhere:1"}.items():
        monkeypatch.setenv(key, value)
    args = parse_torchrun_options(plan.split_at_job()[0])
    assert (args.max_restarts, args.rdzv_endpoint, args.master_addr) == (0, "", "job-master-0")
    assert os.environ["PET_MAX_RESTARTS"] == "3"  # put back for the workers, as torchrun leaves them


# ------------------------------------------------------------------------------------ logs, command
def test_logs_go_under_the_run_dir_with_rank0_teed():
    plan = plan_for(cpu=True, nproc=2)
    assert arg(plan, "--log-dir").endswith("runs/q/logs")
    assert (arg(plan, "--redirects"), arg(plan, "--tee")) == ("3", "0:3")
    assert arg(plan_for(cpu=True, log_dir="/tmp/elsewhere"), "--log-dir") == "/tmp/elsewhere"


def test_max_restarts_is_passed_and_validated():
    assert arg(plan_for(cpu=True, max_restarts=2), "--max-restarts") == "2"
    assert arg(plan_for(cpu=True), "--max-restarts") is None
    assert "0 or more" in usage_error(cpu=True, max_restarts=-1)


def test_command_is_a_shell_line_with_mgpus_variables_then_torchrun():
    plan = plan_for(cpu=True, nproc=2, overrides=("name=my run",))
    words = shlex.split(plan.command())
    n_env = len(plan.env)
    assert dict(w.split("=", 1) for w in words[:n_env]) == plan.env
    assert words[n_env] == "torchrun" and words[n_env + 1 :] == plan.torchrun_args


def test_torch_parses_the_arguments_as_torchrun_would(monkeypatch, tmp_path):
    """The list is valid input for torch.distributed.run, and means what the plan says."""
    from torch.distributed import run as torchrun

    monkeypatch.chdir(tmp_path)  # torch creates the (relative) log dir it is given

    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # config_from_args would otherwise set it in os.environ
    plan = plan_for(cpu=True, nproc=2, max_restarts=1, master_port=29555)
    args = torchrun.parse_args(plan.torchrun_args)
    config, cmd, cmd_args = torchrun.config_from_args(args)
    assert (config.nproc_per_node, config.max_restarts, config.rdzv_backend) == (2, 1, "static")
    assert config.rdzv_endpoint == "127.0.0.1:29555"
    assert cmd_args == ["-u", "-m", WORKER_MODULE, *plan.worker_args]


# ------------------------------------------------------------------------------------------- scripts
SCRIPT = ScriptTarget(path="main.py", args=("--epochs", "10", "--nproc", "9"))


def script_plan(machine_=None, script=SCRIPT, run_dir=None, named=None, **opts):
    opts = LaunchOptions(script=script, run_dir=run_dir, **opts)
    calls = named if named is not None else []
    return build_plan(opts, script_facts(opts), machine_ or machine(), port_check=lambda port: None,
                      host_check=lambda host, wait_s: None,
                      new_id=lambda: "mgpu-fresh",
                      name_run_dir=lambda nnodes, rdzv_id: calls.append((nnodes, rdzv_id)) or f"runs/main-{rdzv_id}")


def test_a_script_runs_in_the_script_job_and_shows_as_plain_torchrun():
    plan = script_plan(cpu=True, nproc=2, run_dir="runs/exp1")
    assert plan.job == "script" and plan.worker_args == ["script", "main.py", "--epochs", "10", "--nproc", "9"]
    assert plan.torchrun_args[-len(plan.worker_args) - 2:] == ["-m", WORKER_MODULE, *plan.worker_args]
    words = shlex.split(plan.command())
    assert words[words.index("torchrun") + 1:] == [*plan.torchrun_args[:plan.torchrun_args.index("-m")],
                                                   "main.py", "--epochs", "10", "--nproc", "9"]
    assert plan.env["CUDA_VISIBLE_DEVICES"] == "" and plan.env["OMP_NUM_THREADS"] == "4"  # 8 cores / 2
    assert plan.env["PYTHONUNBUFFERED"] == "1"
    assert plan.env["MGPU_RUN_DIR"] == os.path.abspath("runs/exp1") and plan.run_dir == "runs/exp1"
    assert plan.log_dir == os.path.abspath("runs/exp1/logs")


def test_the_script_gets_no_recipe_override_and_gpus_are_not_hidden_on_gpus():
    plan = script_plan(machine(gpus=4), gpus="0,2", run_dir="r")
    assert plan.worker_args == ["script", *SCRIPT.words()] and "trainer.device=cpu" not in plan.worker_args
    assert plan.env["CUDA_VISIBLE_DEVICES"] == "0,2" and plan.nproc_per_node == 2
    assert "--cpu --nproc N" in str(pytest.raises(UsageError, script_plan, machine(gpus=0), run_dir="r").value)


def test_a_modules_words_and_the_legacy_local_rank_flag():
    target = ScriptTarget(module="pkg.train", args=("--lr", "1"), local_rank_flag="--local_rank")
    plan = script_plan(script=target, cpu=True, run_dir="r")
    assert plan.worker_args == ["script", "--local-rank-flag", "--local_rank", "-m", "pkg.train", "--lr", "1"]
    assert plan.command().endswith(" -m pkg.train --lr 1")
    assert target.argv("3") == ["--local_rank=3", "--lr", "1"] and target.name == "train"


def test_only_the_options_reach_torchruns_parser():
    plan = script_plan(cpu=True, nproc=2, run_dir="r")
    options, job_args = plan.split_at_job()
    assert options[-3:] == ["-m", WORKER_MODULE, "script"] and job_args == list(SCRIPT.words())
    recipe = plan_for(cpu=True)
    options, job_args = recipe.split_at_job()
    assert options[-1] == "train" and job_args == recipe.worker_args[1:]


def test_the_run_dir_is_named_once_the_plan_stands_and_with_the_nodes_id():
    named: list = []
    plan = script_plan(cpu=True, named=named)
    assert named == [(1, "mgpu-fresh")] and plan.run_dir == "runs/main-mgpu-fresh"
    named.clear()
    with pytest.raises(UsageError):
        script_plan(cpu=True, named=named, show_rank="5")
    assert named == []  # refused before a run dir was named (or created)
    named.clear()
    script_plan(cpu=True, named=named, nnodes=2, master_addr="10.0.0.1", master_port=29500, node_rank=1)
    assert named[0][0] == 2 and named[0][1] != "mgpu-fresh"  # the id every node derives alike


@pytest.mark.parametrize("show, tee", [(None, "0:3"), ("1", "1:3"), ("all", "3")])
def test_show_rank_picks_what_torch_tees(show, tee):
    assert arg(plan_for(cpu=True, nproc=2, show_rank=show), "--tee") == tee


@pytest.mark.parametrize("show", ["2", "-1", "rank0"])
def test_show_rank_out_of_range(show):
    assert "--show-rank" in usage_error(cpu=True, nproc=2, show_rank=show)


@pytest.mark.parametrize("kw, said", [
    ({"script": SCRIPT, "resume": "auto"}, "--resume is for recipes"),
    ({"script": SCRIPT, "overwrite": True}, "--overwrite is for recipes"),
    ({"recipe": "q.yaml", "run_dir": "x"}, "run_dir=x"),
    ({"recipe": "q.yaml", "local_rank_arg": True}, "--local-rank-arg is for scripts"),
])
def test_options_of_the_other_kind_of_job_are_refused(kw, said):
    with pytest.raises(UsageError) as info:
        check_job_options(LaunchOptions(**kw))
    assert said in str(info.value)
    check_job_options(LaunchOptions(script=SCRIPT, run_dir="x", local_rank_arg=True))
