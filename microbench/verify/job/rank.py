"""verify job, rank side: for one storage assignment, prepare its tiers, run the probes the
prediction takes (inputs.py), predict with compose/job.timeline, then run the job itself and
time every phase:

  model load     the model's cached pages dropped, every rank reads every safetensors shard (a
                 file, or an object fetched whole from S3) and copies its own slice of each tensor
                 into the fully_shard model (built beforehand, untimed, as from_pretrained builds
                 the model before it loads; modelload allocates its tensors untimed the same way);
  data stall     every wait in next() of the DataLoader over the job's WebDataset shards (the
                 dataload probe's loader), including the workers' start, until every rank has its
                 batch (a barrier: a rank waiting for data holds the others' first collective),
                 per step the least over ranks (what even the step's slowest rank waited);
  train          forward, backward, AdamW step and zero_grad of each step, from the barrier to the
                 slowest rank's end (verify fsdp's measure);
  ckpt blocking  get_state_dict + dcp.save (or dcp.async_save's return) every --ckpt-every steps;
  ckpt wait      an async save waiting for the previous one's future;
  final save     the last save until durable: dcp.save (async: its future), and on a cached mount
                 until the store holds every checkpoint's bytes (polled over the S3 API).
The total runs from the first byte of the model load to the final save durable; every other
phase is the slowest rank's sum, and the total the slowest rank's."""

from __future__ import annotations

import time
from concurrent.futures import Future
from typing import Any, cast

from ...compose.dataload import DataRate, data_stall
from ...compose.job.timeline import KINDS, JobPlan, PhaseCosts, timeline
from ...world.dist import World
from .. import collector, model as fm
from ..fsdp.steps import error_pct, sync
from .tiers import Place, steady_threads, threads_settled


def data_plan(ranks: int, batch_size: int, steps: int, workers: int, sample_bytes: int) -> Any:
    """The job's dataset: 4 shards per worker of every rank (as dataload plans them), each rank's
    shards holding at least `steps` batches for its workers however they split them."""
    import math

    from ...probes.dataload import dataset as ds

    w = max(1, workers)
    count = 4 * ranks * w
    per = math.ceil(batch_size * math.ceil(steps / w) / 4) + batch_size
    samples = per * count
    return ds.Plan("shards", samples, sample_bytes, sample_bytes,
                   tuple((a, min(a + per, samples)) for a in range(0, samples, per)))


def predict(plan: JobPlan, step: dict[str, Any], model: dict[str, Any], data: dict[str, Any],
            ckpt: dict[str, Any], batch_size: int, workers: int) -> tuple[Any, dict[str, Any]]:
    rate = DataRate(f"dataload probe ({data['workers']} workers)", data["samples_per_s"] / data["ranks"],
                    workers > 0, data["source"])
    stall = data_stall(rate, batch_size, step["step_s"])
    # The first batch waits for the workers to start and the first shard to arrive (the probe's
    # first_batch_s); every later one only for what prefetching does not hide.
    stall_total = data["first_batch_s"] + (plan.steps - 1) * stall.stall_s
    # A fresh model's first step also sets up FSDP's buffers and AdamW's state: that extra, from
    # a throwaway copy's first step, spread over the steps as the timeline has one step time.
    step_s = step["step_s"] + step.get("first_step_extra_s", 0.0) / plan.steps
    costs = PhaseCosts(
        model_load_s=model["load_s"],
        step_s=step_s,
        data_stall_s=stall_total / plan.steps,
        save_blocking_s=ckpt["blocking_s"],
        save_drain_s=max(0.0, ckpt["durable_s"] - ckpt["blocking_s"]),
        drain_blocks_next=ckpt["drain_blocks_next"],
        drain_delay_s=ckpt["drain_delay_s"],
    )
    return timeline(plan, costs), stall.as_dict()


def run_job(world: World, shape: Any, tokens: int, device: Any, precision: Any, plan: JobPlan, model_place: Place,
            keys: list[str], expected_sum: float, data_place: Place, dplan: Any, workers: int, batch_size: int,
            run_dir: Any, progress: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """The job, timed. `progress` (rank 0) holds every finished phase as it finishes."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from ...probes.dataload.loader import as_tensor, loader

    rank, ranks = world.rank, world.size
    torch.manual_seed(1)   # other values than the files hold, so the load is seen to happen
    model = fm.shard(fm.build(shape, device), precision)
    optim = fm.optimizer(model)
    params = dict(model.named_parameters())
    group = world.control
    if plan.async_ckpt:
        import torch.distributed as dist

        # An async save runs its collectives in a thread while training runs its own: on a group
        # of its own, as torch asks (on the training's group the two interleave and hang).
        group = dist.new_group(backend="gloo")
    if not model_place.local:
        # The S3 client made before the clock, as the modelload probe's is made in its warm-up
        # (a botocore session takes about a second to set up, no storage time).
        model_place.client()
    if world.spec.local_rank == 0:
        model_place.drop_cache(keys)
        data_place.drop_cache(dplan.keys())
    # Python's collector as a trainer runs it (collector.py): here an automatic full collection
    # (about 0.16 s over this process's objects) landed inside a DCP save now and then: 0.24 s
    # saves beside the probe's 0.06 s.
    collector.start()
    # The baseline after the collection, once the threads it ended are gone: a DataLoader forks
    # after the model load, and threads_settled must wait for every thread still ending.
    threads = steady_threads()
    world.barrier()
    spent = {k: 0.0 for k in KINDS}
    steps_s: list[float] = []
    t0 = time.perf_counter()

    # -- model load
    from safetensors.torch import load, load_file

    with torch.no_grad():
        for key in keys:
            tensors = load_file(model_place.path(key)) if model_place.local else load(model_place.get(key))
            for name, full in tensors.items():
                # FSDP2 shards dim 0 as torch.chunk does: this rank's chunk is its local tensor.
                local = params[name].to_local()
                chunks = torch.chunk(full, ranks, 0)
                if local.numel() and rank < len(chunks):
                    local.copy_(chunks[rank].reshape(local.shape))
    sync(device)
    threads_settled(threads)   # the fetch pool's threads gone before the DataLoader forks
    world.barrier()   # the load ends when the last rank has its shards
    spent["model_load"] = time.perf_counter() - t0
    local_sum = float(sum(p.to_local().double().sum().item() for p in model.parameters()))
    progress["model_load_s"] = spent["model_load"]

    # -- steps, with the data stall and the checkpoints
    saves = 0
    future = None
    saves_s: list[float] = []     # each periodic save's blocking time
    state_s: list[float] = []     # of which get_state_dict

    def state() -> dict[str, Any]:
        msd, osd = get_state_dict(model, optim)
        return {"model": msd, "optim": osd}

    start = time.perf_counter()
    it = iter(loader(data_place.data_source(), dplan, workers=workers, batch_size=batch_size, prefetch_factor=2,
                     decode_us=0.0, rank=rank, ranks=ranks, pin_memory=False, epoch=1))
    starting = time.perf_counter() - start   # the workers' start, counted with the first batch
    waits_s: list[float] = []     # each batch's wait, until every rank had its own
    data_wrong = 0
    try:
        marks = set(range(plan.ckpt_every, plan.steps, plan.ckpt_every)) if plan.ckpt_every else set()
        for i in range(1, plan.steps + 1):
            start = time.perf_counter()
            datas, wrong, _reqs, _bytes = next(it)
            batch = as_tensor(datas, False)
            # Until every rank has its batch: a rank waiting for data holds the others' first
            # collective, and that wait is the data's, not the step's.
            world.barrier()
            waits_s.append(time.perf_counter() - start + (starting if i == 1 else 0.0))
            spent["data_stall"] += waits_s[-1]
            data_wrong += wrong
            ids = (batch.reshape(-1)[:tokens + 1].long() % shape.vocab).view(1, -1).to(device)
            start = time.perf_counter()
            fm.step(model, optim, ids[:, :-1].contiguous(), ids[:, 1:].contiguous())
            sync(device)
            steps_s.append(time.perf_counter() - start)
            spent["train"] += steps_s[-1]
            if i % collector.EVERY_STEPS == 0:
                collector.young()   # counted as time outside the phases, as in a trainer's loop
            if i in marks:
                saves += 1
                if plan.async_ckpt and future is not None:
                    start = time.perf_counter()
                    future.result()
                    spent["ckpt_wait"] += time.perf_counter() - start
                start = time.perf_counter()
                writer = run_dir.writer(f"step-{i}", 1)
                current = state()
                state_s.append(time.perf_counter() - start)
                if plan.async_ckpt:
                    # A Future: async_save returns an AsyncSaveResponse only when given a stager.
                    future = cast("Future[Any]", dcp.async_save(current, storage_writer=writer, process_group=group))
                else:
                    dcp.save(current, storage_writer=writer, process_group=group)
                del current
                saves_s.append(time.perf_counter() - start)
                spent["ckpt_blocking"] += saves_s[-1]
            progress.update(steps_done=i, checkpoints_done=saves, **{f"{k}_s": v for k, v in spent.items() if v})
    finally:
        # The workers shut down (a trainer's loop ends the same way); after a failure too, or a
        # worker blocked writing its next batch outlives the rank.
        shutdown = getattr(it, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
        del it

    # -- the final save, until durable
    if plan.async_ckpt and future is not None:
        start = time.perf_counter()
        future.result()
        spent["ckpt_wait"] += time.perf_counter() - start
    start = time.perf_counter()
    writer = run_dir.writer(f"step-{plan.steps}", 1)
    if plan.async_ckpt:
        cast("Future[Any]", dcp.async_save(state(), storage_writer=writer, process_group=group)).result()
    else:
        dcp.save(state(), storage_writer=writer, process_group=group)
    durable = _wait_durable(world, run_dir, start, timeout_s)
    spent["final_save"] = time.perf_counter() - start
    total = time.perf_counter() - t0
    progress.update(final_save_s=spent["final_save"], total_s=total)
    collector.stop()

    every = world.all_gather_object((spent, total, steps_s, local_sum, data_wrong, saves_s, state_s, waits_s))
    measured = {k: max(e[0][k] for e in every) for k in KINDS}
    # A step lasts until its slowest rank is done (the others wait for it at the next barrier);
    # the data stall is what even that rank waited for its batch (the least wait over ranks): the
    # two add up to the time between barriers, with no rank's skew counted twice.
    steps = [max(e[2][j] for e in every) for j in range(plan.steps)]
    waits = [min(e[7][j] for e in every) for j in range(plan.steps)]
    measured["train"], measured["data_stall"] = sum(steps), sum(waits)
    loaded_sum = sum(e[3] for e in every)
    return {"phases_s": measured, "total_s": max(e[1] for e in every),
            "per_rank_total_s": [e[1] for e in every],
            "steps_s": steps,
            "checkpoints": saves + 1, "durable": durable,
            "gc": collector.NOTE,
            "saves_s": [max(e[5][j] for e in every) for j in range(saves)],
            "get_state_dict_s": [max(e[6][j] for e in every) for j in range(saves)],
            "data_waits_s": waits,
            "model_wrong": int(abs(loaded_sum - expected_sum) > 1e-6 * (abs(expected_sum) + 1)),
            "data_wrong": sum(e[4] for e in every)}


def _wait_durable(world: World, run_dir: Any, started: float, timeout_s: float) -> str:
    """On a cached mount rank 0 polls the store until it holds every checkpoint of the run."""
    from ...targets.mount import facts as mount_facts

    facts = mount_facts.facts_for_path(run_dir.root) if run_dir.target.kind == "local" else None
    if not (facts and facts.get("mount_name")):
        world.barrier()
        return "when dcp.save returned (fsync'd files or completed uploads)"
    if world.rank == 0:
        mount_facts.wait_durable(run_dir.root, started_at=started, timeout_s=timeout_s)
    world.barrier()
    return "when the store held every checkpoint's bytes (polled over the S3 API)"


def compare(tl: Any, measured: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Per phase kind and for the total: predicted, measured, error."""
    predicted = tl.time_by_kind()
    phases = {}
    for kind in KINDS:
        if kind == "ckpt_drain":
            continue   # overlapped with training: no time of its own on the critical path
        p, m = predicted[kind], measured["phases_s"][kind]
        phases[kind] = {"predicted_s": p, "measured_s": m, "error_pct": error_pct(p, m) if m > 0 else None,
                        "share_measured": m / measured["total_s"] if measured["total_s"] > 0 else 0.0}
    accounted = sum(measured["phases_s"][k] for k in KINDS if k != "ckpt_drain")
    total = {"predicted_s": tl.total_s, "measured_s": measured["total_s"],
             "error_pct": error_pct(tl.total_s, measured["total_s"]),
             "unaccounted_s": measured["total_s"] - accounted}
    return phases, total


def model_bytes(state: dict[str, Any]) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


def checksum(state: dict[str, Any]) -> float:
    return float(sum(t.double().sum().item() for t in state.values()))

