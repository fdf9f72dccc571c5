"""The `quantize` stage: PT2E prepare / calibrate (or train) / convert, when quant is set."""

from __future__ import annotations

import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from ..config import QuantScheme
from ..errors import EtbuildError
from ..progress import Progress
from ..runner import Context
from .export import export_program


def _train(prepared, qcfg, batches, teacher) -> float:
    node = OmegaConf.to_container(qcfg.qat.train_step, resolve=True)
    try:
        step = instantiate(node)
    except Exception as exc:  # user code
        raise EtbuildError(f"quant.qat.train_step could not be instantiated: {exc}") from None
    loss = float("nan")
    with Progress("training (QAT)", total=qcfg.qat.steps) as progress:
        for i in range(qcfg.qat.steps):
            loss = step(prepared, batches[i % len(batches)], teacher)
            progress.update(i + 1)
    return float(loss) if loss is not None else float("nan")


def run(ctx: Context) -> None:
    qcfg, mcfg = ctx.cfg.quant, ctx.cfg.model
    scheme = QuantScheme(qcfg.scheme)
    if scheme == QuantScheme.none:
        ctx.summarize(scheme="none")
        return
    # torchao is imported only for quantized builds.
    from torchao.quantization.pt2e import move_exported_model_to_eval
    from torchao.quantization.pt2e.quantize_pt2e import (
        convert_pt2e,
        prepare_pt2e,
        prepare_qat_pt2e,
    )

    from ..quant.calibration import calibration_batches
    from ..quant.quantizer import EtbQuantizer

    module = ctx.artifacts["module"]
    inputs = ctx.artifacts["example_inputs"]
    quantizer = EtbQuantizer(qcfg)
    # Dynamic quantization needs no activation statistics, but one pass lets the weight
    # observers see the weights.
    batches = [inputs] if scheme == QuantScheme.dynamic else calibration_batches(qcfg, mcfg)
    facts: dict = {"scheme": scheme.value}
    if scheme == QuantScheme.qat:
        import copy

        student = copy.deepcopy(module).train()
        graph = export_program(student, mcfg, inputs)
        prepared = prepare_qat_pt2e(graph.module(), quantizer)
        facts["qat_final_loss"] = round(_train(prepared, qcfg, batches, module), 6)
        move_exported_model_to_eval(prepared)
    else:
        prepared = prepare_pt2e(ctx.artifacts["exported"].module(), quantizer)
        with torch.no_grad(), Progress("calibrating", total=len(batches)) as progress:
            for i, batch in enumerate(batches, 1):
                prepared(*batch)
                progress.update(i)
    converted = convert_pt2e(prepared)
    ctx.artifacts["quantized_module"] = converted
    ctx.artifacts["exported"] = export_program(converted, mcfg, inputs)
    facts["calibration_batches"] = len(batches)
    ctx.summarize(**facts)
