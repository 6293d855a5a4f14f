"""Speedrun: nanoGPT's Shakespeare recipe against specs/shakespeare-speedrun.yaml, one after the other.

Both train on ``<repo>/../shared/data/tinyshakespeare.txt`` (first 90% train, last 10%
validation, byte tokens), with the same tokens per step (12 rows of 64) and the same CPU
thread count, evaluating the whole validation split every ``--eval-every`` steps. Printed
for each: steps, wall time, CPU time (``time.process_time``: this process' CPU seconds, which
other load on a shared machine does not inflate the way it inflates wall time), the final
validation loss, and the step, training wall time and training CPU time at which the
validation loss first reaches ``--target`` (1.88, nanoGPT's published result).
"Training time" leaves out the evaluations (both runs evaluate alike, and evaluating more
often only makes the crossing point sharper) and starts after the first step (so reading and
tokenizing the corpus count for neither); "wall s" and "cpu s" are the whole run's.

    python benchmarks/speedrun.py [--data PATH] [--threads 1] [--eval-every 50] [--only speedrun|nanogpt]
                                  [--set train.steps=600 ...]   # overrides for the speedrun spec
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NANOGPT_SPEC = REPO / "specs" / "shakespeare-char.yaml"
SPEEDRUN_SPEC = REPO / "specs" / "shakespeare-speedrun.yaml"
TARGET = 1.88  # nanoGPT README, CPU shakespeare_char, iter 2000


@dataclass
class Clock:
    """A plugin that notes the clocks at every step and evaluation, and keeps evaluation time apart."""

    evals: list[tuple[int, float, float, float]] = field(default_factory=list)  # step, val, train wall, train cpu
    start_wall: float = 0.0
    start_cpu: float = 0.0
    eval_wall: float = 0.0  # seconds spent evaluating so far
    eval_cpu: float = 0.0
    last_step: tuple[float, float] = (0.0, 0.0)
    begun: tuple[float, float] = (0.0, 0.0)  # the clocks when the run was started (setup included)

    def begin(self) -> None:
        self.begun = (time.perf_counter(), time.process_time())
        self.start_wall, self.start_cpu = self.last_step = self.begun

    def specformer_on_train_step(self, step: int, metrics: dict) -> None:
        self.last_step = (time.perf_counter(), time.process_time())
        if step == 1:
            # Clocks start once the first step is done, so the setup (reading and tokenizing the corpus,
            # cached after the first run) counts for neither.
            self.start_wall, self.start_cpu = self.last_step

    def specformer_on_eval(self, step: int, metrics: dict) -> None:
        wall, cpu = time.perf_counter(), time.process_time()
        # Training time up to this step's end: everything since the start but earlier evaluations.
        train_wall = self.last_step[0] - self.start_wall - self.eval_wall
        train_cpu = self.last_step[1] - self.start_cpu - self.eval_cpu
        self.evals.append((step, metrics["val_loss"], train_wall, train_cpu))
        self.eval_wall += wall - self.last_step[0]  # this evaluation
        self.eval_cpu += cpu - self.last_step[1]


@dataclass
class Outcome:
    name: str
    params: int
    steps: int
    wall: float
    cpu: float
    val_loss: float
    crossing: tuple[int, float, float] | None  # step, train wall, train cpu
    train_wall: float  # training time of the whole run (evaluations left out)
    train_cpu: float


def run(name: str, spec: Path, *, data: str, threads: int, eval_every: int, target: float,
        overrides: list[str], out: Path) -> Outcome:
    import specformer
    from specformer.registry.hookspecs import hookimpl
    from specformer.registry.discovery import get_plugin_manager
    from specformer_train import train

    clock = Clock()
    hooked = type("ClockPlugin", (), {
        "specformer_on_train_step": hookimpl(lambda self, step, metrics: clock.specformer_on_train_step(step, metrics)),
        "specformer_on_eval": hookimpl(lambda self, step, metrics: clock.specformer_on_eval(step, metrics)),
    })()
    settings = [f"train.threads={threads}", f"train.eval_every={eval_every}", "train.eval_steps=null",
                "train.save_every=0", "train.sample_tokens=0", "train.progress=false", "train.plot=false",
                "train.tensorboard=false", *overrides]
    manager = get_plugin_manager()
    manager.register(hooked, name=f"speedrun-clock-{name}")
    try:
        clock.begin()
        result = train(spec, data=data, out_dir=str(out / name), overrides=settings)
        wall, cpu = time.perf_counter() - clock.begun[0], time.process_time() - clock.begun[1]
    finally:
        manager.unregister(hooked)
    crossing = next(((s, w, c) for s, v, w, c in clock.evals if v <= target), None)
    params = sum(p.numel() for p in specformer.load(out / name / "model.safetensors").parameters())
    train_wall, train_cpu = clock.last_step[0] - clock.start_wall - clock.eval_wall, \
        clock.last_step[1] - clock.start_cpu - clock.eval_cpu
    if clock.evals and clock.evals[-1][0] == result.step:  # the final evaluation came after the last step
        train_wall, train_cpu = clock.evals[-1][2], clock.evals[-1][3]
    return Outcome(name, params, result.step, wall, cpu, result.val_loss, crossing, train_wall, train_cpu)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(REPO.parent / "shared" / "data" / "tinyshakespeare.txt"))
    parser.add_argument("--threads", type=int, default=1, help="CPU threads of both runs (default 1)")
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument("--target", type=float, default=TARGET)
    parser.add_argument("--only", choices=["nanogpt", "speedrun"], default=None)
    parser.add_argument("--speedrun-spec", default=str(SPEEDRUN_SPEC))
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a value of the speedrun spec (repeatable)")
    parser.add_argument("--out", default=None, help="run directories (default: a temporary directory)")
    args = parser.parse_args()
    if not Path(args.data).is_file():
        print(f"no corpus at {args.data}; pass --data PATH to tinyshakespeare.txt", file=sys.stderr)
        return 2

    import torch

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(args.out) if args.out else Path(tmp)
        plan = [("nanogpt", NANOGPT_SPEC, []), ("speedrun", Path(args.speedrun_spec), args.set)]
        outcomes = []
        for name, spec, overrides in plan:
            if args.only and name != args.only:
                continue
            print(f"training {name} ({spec.name}) ...", flush=True)
            outcomes.append(run(name, spec, data=args.data, threads=args.threads, eval_every=args.eval_every,
                                target=args.target, overrides=overrides, out=out))
    print(f"\nTiny Shakespeare (bytes), 12 x 64 tokens per step, {args.threads} thread(s), torch {torch.__version__}; "
          f"validation: the whole split every {args.eval_every} steps")
    print(f"  {'':<10}{'params':>9}{'steps':>7}{'wall s':>8}{'cpu s':>8}{'train wall':>12}{'train cpu':>11}"
          f"{'val loss':>10}  | {'first <= ' + str(args.target):<15}{'step':>5}{'train wall':>12}{'train cpu':>11}")
    for o in outcomes:
        cross = (f"{o.crossing[0]:>5}{o.crossing[1]:>12.1f}{o.crossing[2]:>11.1f}" if o.crossing
                 else f"{'never':>5}{'':>12}{'':>11}")
        print(f"  {o.name:<10}{o.params:>9,}{o.steps:>7}{o.wall:>8.1f}{o.cpu:>8.1f}{o.train_wall:>12.1f}"
              f"{o.train_cpu:>11.1f}{o.val_loss:>10.4f}  | {'':<15}{cross}")
    if len(outcomes) == 2 and outcomes[1].crossing:
        nanogpt, speedrun = outcomes
        # nanoGPT's recipe ends near 1.885 on our split (published: 1.88): where it does not reach the
        # target, its whole training (all 2000 steps) is what the speedrun is measured against.
        a = nanogpt.crossing or (nanogpt.steps, nanogpt.train_wall, nanogpt.train_cpu)
        b = speedrun.crossing
        against = "first crossing" if nanogpt.crossing else f"whole training ({nanogpt.steps} steps)"
        print(f"\n  speedrun's first crossing against nanoGPT's {against}: steps {b[0] / a[0]:.2f}x, "
              f"training wall time {b[1] / a[1]:.2f}x, training CPU time {b[2] / a[2]:.2f}x (target: <= 0.5x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
