"""The progress bar and the throughput figures on it: tokens/s and model FLOPs utilisation.

MFU (PaLM, Chowdhery et al. 2022, appendix B) = achieved model FLOPs / peak FLOPs.
Model FLOPs per trained token come from :func:`specformer.summarize`:
3x the forward's ``2N + attention`` (``6 * N_matmul + 12 * n_layers * n_heads * head_dim * T``
when values are as wide as keys; T the context length, or the window of sliding-window layers).
Recomputation from activation checkpointing is not counted (it is not model work).

Peak FLOPs are the dense tensor-core figures of NVIDIA's datasheets for the precision
training runs in (bf16, or TF32 for fp32 matmuls). A CPU has no such reference figure
(it depends on cores, vector width and clocks), so on CPU the bar shows the achieved
GFLOP/s instead of an MFU.
"""

from __future__ import annotations

import sys

import torch
from tqdm.auto import tqdm

#: Dense peak TFLOP/s per GPU by (name fragment, precision); the first matching fragment wins.
PEAK_TFLOPS: list[tuple[str, dict[str, float]]] = [
    ("H200", {"bf16": 989.0, "tf32": 494.7}),
    ("H100 PCIe", {"bf16": 756.0, "tf32": 378.0}),
    ("H100", {"bf16": 989.0, "tf32": 494.7}),
    ("B200", {"bf16": 2250.0, "tf32": 1100.0}),
    ("A100", {"bf16": 312.0, "tf32": 156.0}),
    ("L40S", {"bf16": 362.0, "tf32": 183.0}),
    ("L4", {"bf16": 121.0, "tf32": 60.0}),
    ("A10G", {"bf16": 70.0, "tf32": 35.0}),
    ("A10", {"bf16": 125.0, "tf32": 62.5}),
    ("RTX 4090", {"bf16": 165.2, "tf32": 82.6}),
    ("RTX 3090", {"bf16": 71.0, "tf32": 35.6}),
    ("V100", {"bf16": 125.0, "tf32": 15.7}),  # V100 has fp16 tensor cores, no bf16: fp16 figure
    ("T4", {"bf16": 65.0, "tf32": 8.1}),
]


def peak_flops(device: torch.device, *, precision: str) -> float | None:
    """Peak FLOP/s of ``device`` for ``precision`` ('bf16' or 'fp32'); None when unknown (CPU, unlisted GPUs)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    key = "bf16" if precision == "bf16" else "tf32"
    for fragment, figures in PEAK_TFLOPS:
        if fragment in name:
            return figures[key] * 1e12
    return None


def mfu(tokens_per_s: float, *, flops_per_token: float, peak: float | None, world_size: int = 1) -> float | None:
    """Achieved model FLOP/s over the peak of all ``world_size`` devices; None without a peak."""
    if peak is None or peak <= 0:
        return None
    return tokens_per_s * flops_per_token / (peak * world_size)


class ProgressBar:
    """A tqdm bar over optimizer steps showing loss, lr, tokens/s and MFU (GFLOP/s on CPU)."""

    def __init__(self, *, total: int, initial: int, enabled: bool, flops_per_token: float,
                 peak: float | None, world_size: int) -> None:
        # Redrawn ten times a second on a terminal; in a log file (no terminal) a line every 30 s.
        interval = 0.1 if sys.stderr.isatty() else 30.0
        self.bar = tqdm(total=total, initial=initial, disable=not enabled, unit="step", dynamic_ncols=True,
                        desc="train", leave=True, mininterval=interval)
        self.flops_per_token = flops_per_token
        self.peak = peak
        self.world_size = world_size

    def update(self, steps: int, *, loss: float, lr: float, tokens_per_s: float,
               mtp_loss: float | None = None) -> dict[str, float]:
        """Advance by ``steps``; return the throughput figures shown (for the metrics log).

        ``mtp_loss`` (a model training multi-token prediction depths) is shown beside the next-token loss.
        """
        shown = {"loss": f"{loss:.4f}", "lr": f"{lr:.2e}", "tok/s": f"{tokens_per_s:,.0f}"}
        if mtp_loss is not None:
            shown = {"loss": shown["loss"], "mtp": f"{mtp_loss:.4f}", **shown}
        figures: dict[str, float] = {}
        utilisation = mfu(tokens_per_s, flops_per_token=self.flops_per_token, peak=self.peak,
                          world_size=self.world_size)
        if utilisation is None:
            gflops = tokens_per_s * self.flops_per_token / 1e9
            shown["GFLOP/s"] = f"{gflops:.1f}"
            figures["gflops_per_s"] = gflops
        else:
            shown["mfu"] = f"{100 * utilisation:.1f}%"
            figures["mfu"] = utilisation
        self.bar.set_postfix(shown, refresh=False)
        self.bar.update(steps)
        return figures

    def write(self, text: str) -> None:
        """Print above the bar (or plainly when it is disabled)."""
        if self.bar.disable:
            print(text, flush=True)
        else:
            self.bar.write(text)

    def close(self) -> None:
        self.bar.close()
