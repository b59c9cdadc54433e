"""A measurement on one GPU against a claim the paper measured on another: the one rule, applied by code.

Each paper measured on its own class of GPU (:data:`PAPER_GPUS`, from the papers' setups). A value measured here is
compared according to the kind of quantity it is:

* :data:`ABSOLUTE` (TFLOP/s, seconds, days per epoch, PFLOP/s of a cluster): as much a property of the GPU as of
  the method. Compared as printed on the paper's class of GPU only; measured on another, the row shows the value
  with both GPUs named in its ``hardware`` column and is "not decidable" (never compared, never counted).
* :data:`NORMALISED` (a share of the GPU's own peak, a fraction of a bound, a ratio of two runs on the same GPU):
  compared as printed on any GPU. On a GPU other than the paper's, the row names both in its ``hardware`` column and
  the report counts it in a column of its own ("on other hardware"), never in the headline.
* :data:`ESTIMATE` (a model's value computed from a measured one, e.g. Amdahl's end-to-end speedup from a measured
  operator speedup): as NORMALISED, and its evidence is never "measured" (:func:`compare` refuses that).
"""

from __future__ import annotations

import dataclasses
import re

from repro.verdicts import check_value, needs_gpu, not_decidable
from repro.vocabulary import ClaimCheck, Null

ABSOLUTE, NORMALISED, ESTIMATE = "absolute", "normalised", "estimate"
KINDS = (ABSOLUTE, NORMALISED, ESTIMATE)

#: The GPU class each paper measured on (Megatron-LM: 32 GB V100s in DGX-2H; ZeRO and ZeRO-Infinity: 32 GB V100s in
#: DGX-2; MT-NLG: 80 GB A100s in DGX A100 (Selene); GNA: B200). T3 reports simulated GPUs: no class matches it.
PAPER_GPUS = {"megatron_lm_2019": "V100", "zero_2019": "V100", "zero_infinity_2021": "V100", "mt_nlg_2022": "A100",
              "gna_2025": "B200"}
#: GPU classes recognised in a device name, longest first (so that GB200 is not read as B200)
_CLASSES = ("GB200", "B200", "B100", "GH200", "H200", "H100", "H800", "H20", "A100", "A800", "A40", "A30", "A10",
            "V100", "L40S", "L40", "L4", "T4", "MI300X", "MI250X", "MI250", "MI210")


def gpu_class(name: str | None) -> str | None:
    """``NVIDIA H200`` -> ``H200``, ``Tesla V100-SXM2-32GB`` -> ``V100``; None for no name, a CPU or an unknown GPU."""
    text = str(name or "").upper()
    return next((c for c in _CLASSES if re.search(rf"(?<![A-Z0-9]){c}(?![0-9])", text)), None)


def on_papers_hardware(paper: str, gpu: str | None) -> bool:
    cls = gpu_class(gpu)
    return cls is not None and cls == PAPER_GPUS.get(paper)


def hardware_label(paper: str, gpu: str | None) -> str:
    """``""`` on the paper's class of GPU, else ``NVIDIA H200 (paper: V100)``: what the ``hardware`` column says."""
    if on_papers_hardware(paper, gpu):
        return ""
    return f"{gpu} (paper: {PAPER_GPUS.get(paper, 'simulated GPUs')})"


def compare(paper: str, claim_id: str, value: float | None, *, gpu: str | None, kind: str, note: str = "",
            evidence: str = "measured", rel: float | None = None, abs: float | None = None,
            same_as: str = "", unit: str = "", null: Null | None = None,
            basis: str | tuple[str, ...] = "") -> ClaimCheck:
    """The claim check of ``value`` measured on ``gpu`` by the rule above (``rel``/``abs``/``null``/``basis`` as for
    :func:`repro.verdicts.check_value`); ``unit`` only formats the note of an absolute value not compared."""
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r} must be one of {KINDS}")
    if kind == ESTIMATE and evidence == "measured":
        raise ValueError(f"{claim_id}: an estimate computed from a measurement is not itself measured evidence")
    if value is None:
        return needs_gpu(paper, claim_id, note, evidence=evidence)
    if gpu_class(gpu) is None:
        return needs_gpu(paper, claim_id, f"measured without a known GPU ({gpu or 'CPU stand-in'}): "
                                          f"{value:.4g}{unit}" + (f"; {note}" if note else ""), evidence=evidence)
    label = hardware_label(paper, gpu)
    if kind == ABSOLUTE and label:
        shown = not_decidable(paper, claim_id, value, evidence=evidence, null=null, basis=basis,
                              reason=f"an absolute quantity is compared on the paper's {PAPER_GPUS.get(paper, 'hardware')}"
                                     f" only; measured on {gpu}: {value:.4g}{unit}" + (f" ({note})" if note else ""))
        return dataclasses.replace(shown, hardware=label)
    check = check_value(paper, claim_id, value, evidence=evidence, rel=rel, abs=abs, note=note, same_as=same_as,
                        null=null, basis=basis)
    if not label:
        return check
    return dataclasses.replace(check, hardware=label, note=f"on other hardware: {label}; {check.note}")
