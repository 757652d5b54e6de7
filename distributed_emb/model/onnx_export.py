"""A saved sentence-transformers directory as ONE ONNX graph: token ids in, sentence embedding out.

sentence-transformers' own ONNX backend (``SentenceTransformer(path, backend="onnx")`` and its
``export_*_onnx_model`` functions) needs ``optimum-onnx``, which requires transformers < 4.58,
below this project's floor; it also exports the Transformer alone and runs Pooling, Dense and
Normalize in torch. Here every module of the model is in the graph, so a server needs
onnxruntime and a tokenizer, nothing else, and no module can be left out on the way: a model
holding a module this exporter does not know is refused, never exported without it.

Writes into ``MODEL_DIR/onnx/`` (replaced whole, so a stale graph never sits beside a new one):

- ``model.onnx``: fp32, inputs ``input_ids``, ``attention_mask`` (and ``token_type_ids`` where
  the tokenizer makes them), both axes dynamic; output ``sentence_embedding`` (batch, d);
- ``model_qint8.onnx``: the same graph with int8 weights (onnxruntime's dynamic quantisation,
  what sentence-transformers' ``export_dynamic_quantized_onnx_model`` runs underneath);
- ``tokenizer/``: the tokenizer exactly as the SentenceTransformer uses it;
- ``export.json``: the modules the graph holds, the opset, inputs, max_seq_length, the files.

The graph is not a drop-in for ``backend="onnx"``, which expects a Transformer-only graph:
optimum reads an output named ``last_hidden_state``, which this graph does not have, so loaded
that way it fails rather than embedding wrongly. Serve it with
:class:`~distributed_emb.model.onnx_embedder.OnnxEmbedder`.
"""

from __future__ import annotations

import json
import logging
import os
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch

from distributed_emb.atomic_files import staged_directory, write_text_atomic
from distributed_emb.errors import UserInputError
from distributed_emb.model.onnx_config import DEFAULT_OPSET, VARIANTS
from distributed_emb.model.onnx_files import (
    EXPORT_INFO_FILE,
    EXPORTER,
    ONNX_DIR,
    TOKENIZER_DIR,
    VARIANT_FILES,
)
from distributed_emb.model.sentence_transformer import _st_modules, is_sentence_transformer_dir

OUTPUT_NAME = "sentence_embedding"

log = logging.getLogger(__name__)


class UnexportableModelError(UserInputError):
    """The model cannot become one ONNX graph without losing part of what it computes."""


class SentenceEmbeddingGraph(torch.nn.Module):
    """The SentenceTransformer's forward as a function of tensors: (input tensors in
    `input_names` order) → (batch, d) sentence embedding, through every module in order."""

    def __init__(self, model, input_names: Sequence[str]) -> None:
        super().__init__()
        self.model = model
        self.input_names = tuple(input_names)

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        features = dict(zip(self.input_names, inputs, strict=True))
        return self.model(features)[OUTPUT_NAME]  # (batch, d)


def describe_graph_modules(model, model_dir: str | os.PathLike) -> list[str]:
    """One name per module of `model`, in order (``["Transformer", "Pooling(mean)",
    "Normalize"]``); UnexportableModelError for a model the graph cannot hold whole."""
    modules = _st_modules()
    exportable = (
        modules.Pooling,
        modules.Dense,
        modules.Normalize,
        modules.LayerNorm,
        modules.Dropout,
    )
    stack = list(model)
    names = []
    for index, module in enumerate(stack):
        kind = type(module)
        # Exact types: a subclass may compute something else in its forward.
        if index == 0:
            if kind is not modules.Transformer:
                raise UnexportableModelError(
                    f"{model_dir}: module 0 is {kind.__module__}.{kind.__name__}; the ONNX export "
                    "needs a Transformer first (token ids in)"
                )
            names.append("Transformer")
        elif kind in exportable:
            names.append(_module_name(module))
        else:
            raise UnexportableModelError(
                f"{model_dir}: module {index} ({kind.__module__}.{kind.__name__}) cannot be put "
                "in the ONNX graph (it holds Transformer, then Pooling, Dense, Normalize, "
                "LayerNorm, Dropout); refusing rather than exporting the model without it"
            )
    # Prompts are text, not in the graph: OnnxEmbedder prepends them (the model's prompts, read
    # from its config_sentence_transformers.json) as sentence-transformers does. What the graph
    # cannot do is leave the prompt's tokens out of the pooling (Pooling include_prompt=False,
    # as INSTRUCTOR models pool): it would average them in.
    prompts = sorted(name for name, text in (model.prompts or {}).items() if text)
    excluding = [m for m in stack[1:] if getattr(m, "include_prompt", True) is False]
    if prompts and excluding:
        raise UnexportableModelError(
            f"{model_dir}: the model's pooling leaves its prompts' tokens out "
            f"(include_prompt=False; prompts {', '.join(prompts)}), which the ONNX graph, fed "
            "the prompted text, cannot do"
        )
    return names


def _module_name(module) -> str:
    modules = _st_modules()
    if isinstance(module, modules.Pooling):
        mode = module.pooling_mode
        return f"Pooling({mode if isinstance(mode, str) else '+'.join(mode)})"
    if isinstance(module, modules.Dense):
        name = f"Dense {module.in_features}→{module.out_features}"
        activation = module.activation_function
        if not isinstance(activation, torch.nn.Identity):
            name += f" {type(activation).__name__}"
        return name
    if isinstance(module, modules.LayerNorm):
        return f"LayerNorm({module.dimension})"
    return type(module).__name__  # Normalize, Dropout (identity at inference)


def check_export_target(model_dir: str | os.PathLike) -> Path:
    """Before anything loads: `model_dir` is a local sentence-transformers directory this process
    can write its onnx/ folder into, and any onnx/ folder there is one this exporter wrote (it is
    replaced whole). Returns the onnx/ folder's path."""
    model_dir = Path(model_dir)
    if not is_sentence_transformer_dir(model_dir):
        raise UnexportableModelError(
            f"{model_dir}: not a sentence-transformers directory (no modules.json); the ONNX "
            "export reads the modules the model embeds with"
        )
    target = model_dir / ONNX_DIR
    if target.exists() and not (target / EXPORT_INFO_FILE).is_file():
        raise UnexportableModelError(
            f"{target}: holds files this export did not write (no {EXPORT_INFO_FILE}); it "
            "replaces the folder whole, so move them first"
        )
    if not os.access(model_dir, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise UnexportableModelError(
            f"{model_dir}: not writable; the ONNX files go into its {ONNX_DIR}/ folder (export "
            "a copy of the directory)"
        )
    return target


def export_onnx(
    model_dir: str | os.PathLike,
    variants: Sequence[str] = VARIANTS,
    opset: int = DEFAULT_OPSET,
    int8_per_channel: bool = True,
    int8_reduce_range: bool = False,
) -> dict:
    """Export the sentence-transformers directory `model_dir` into its onnx/ folder (see the
    module docstring) and return what export.json holds."""
    from sentence_transformers import SentenceTransformer  # startup

    unknown = sorted(set(variants) - set(VARIANT_FILES))
    if unknown or not variants:
        raise ValueError(f"variants {list(variants)}: expected some of {sorted(VARIANT_FILES)}")
    target = check_export_target(model_dir)
    model = SentenceTransformer(str(model_dir), device="cpu").eval()
    module_names = describe_graph_modules(model, model_dir)
    # Two texts of different lengths: the traced batch has padding, so the attention mask is
    # used the way every real batch uses it.
    probe = model.preprocess(["a sentence embedding", "an embedding"])
    # Every tensor the tokenizer makes is a graph input (not the "modality" tag).
    input_names = [name for name, value in probe.items() if isinstance(value, torch.Tensor)]
    inputs = tuple(probe[name] for name in input_names)
    graph = SentenceEmbeddingGraph(model, input_names).eval()
    with torch.no_grad():
        dimension = int(graph(*inputs).shape[1])

    with staged_directory(target) as staged:
        fp32 = staged / VARIANT_FILES["fp32"]
        write_graph(graph, inputs, input_names, fp32, opset)
        files = {}
        if "int8" in variants:
            files["int8"] = quantize_int8(
                fp32, staged / VARIANT_FILES["int8"], int8_per_channel, int8_reduce_range
            )
        if "fp32" in variants:
            files["fp32"] = {"file": fp32.name}
        else:  # written only as the int8 graph's source
            fp32.unlink()
        model.tokenizer.save_pretrained(str(staged / TOKENIZER_DIR))
        info = {
            "exporter": EXPORTER,
            "modules": module_names,
            "opset": opset,
            "inputs": input_names,
            "output": OUTPUT_NAME,
            "dimension": dimension,
            "max_seq_length": model.max_seq_length,
            "tokenizer": TOKENIZER_DIR,
            "variants": {name: files[name] for name in VARIANTS if name in files},
            "versions": _versions(),
        }
        write_text_atomic(staged / EXPORT_INFO_FILE, json.dumps(info, indent=1) + "\n")
    return info


def write_graph(
    graph: SentenceEmbeddingGraph,
    inputs: tuple[torch.Tensor, ...],
    input_names: list[str],
    path: Path,
    opset: int,
) -> None:
    """`graph` traced on `inputs` into `path`, batch and sequence axes dynamic.

    The TorchScript exporter (``dynamo=False``): it needs nothing beyond torch and onnx, and on
    MiniLM it exported in 1.6 s against the torch.export-based exporter's 6 s (which also needs
    onnxscript), both graphs within 3e-7 of torch. It warns that branches on tensor values
    become constants: those in transformers' mask code and in Pooling are fixed for an encoder
    fed padded batches, and the check (model/serving_check.py) compares the graph with torch
    on real batches. It also warns that advanced indexing goes wrong with negative indices:
    the only such index is transformers' padding-mask lookup, by aranges from 0.
    """
    axes = {0: "batch", 1: "sequence"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        warnings.filterwarnings("ignore", message=".*legacy TorchScript-based ONNX export")
        warnings.filterwarnings("ignore", message="Exporting aten::index operator")
        torch.onnx.export(
            graph,
            inputs,
            str(path),
            dynamo=False,
            input_names=input_names,
            output_names=[OUTPUT_NAME],
            dynamic_axes={**{name: axes for name in input_names}, OUTPUT_NAME: {0: "batch"}},
            opset_version=opset,
            do_constant_folding=True,
        )


def quantize_int8(source: Path, path: Path, per_channel: bool, reduce_range: bool) -> dict:
    """`source` with int8 weights into `path` (activations are quantised at run time, per
    batch); what export.json records about it.

    The graph is first fused by onnxruntime's transformer optimizer (attention, layer norms
    and GELU as single onnxruntime operators: :func:`fused_for_onnxruntime`), then quantised.
    On a 2-core Xeon, MiniLM's int8 graph embedded 300 passages of ~200 tokens 12% faster
    fused than not (43.6 → 48.9 rows/s), with the same cosine to torch (0.9950). The fp32
    graph stays unfused: it is the portable one, any ONNX runtime reads it; the int8 graph is
    onnxruntime's anyway (its dynamic quantisation).
    """
    import onnx  # startup
    from onnxruntime.quantization import QuantType, quantize_dynamic  # startup

    # The quantiser logs on the root logger: a line per tensor it skips, at INFO (a job's
    # level), and advice to pre-process the graph first, whose shape inference fails on these
    # graphs ("Incomplete symbolic shape inference"); sentence-transformers' int8 export skips
    # that step too.
    root = logging.getLogger()
    level = root.level
    root.setLevel(max(level, logging.WARNING))
    root.addFilter(_not_preprocessing_advice)
    fused = path.with_name(path.stem + ".fused.onnx")
    try:
        fusion = fused_for_onnxruntime(source, fused)
        quantize_dynamic(
            str(fused if fusion else source),
            str(path),
            weight_type=QuantType.QInt8,
            per_channel=per_channel,
            reduce_range=reduce_range,
            # The fused operators are onnxruntime's own (domain com.microsoft), which ONNX's
            # shape inference cannot type; their float tensors are float32.
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
        )
    finally:
        fused.unlink(missing_ok=True)
        root.removeFilter(_not_preprocessing_advice)
        root.setLevel(level)
    return {
        "file": path.name,
        "quantization": {
            "method": "onnxruntime.quantization.quantize_dynamic",
            "weights": "int8",
            "per_channel": per_channel,
            "reduce_range": reduce_range,
            # {operator: count} fused before quantising; None where the optimizer failed.
            "fused": fusion,
        },
    }


def fused_for_onnxruntime(source: Path, path: Path) -> dict[str, int] | None:
    """`source` through onnxruntime's transformer optimizer for BERT-like encoders
    (``onnxruntime.transformers.optimizer.optimize_model``, heads and width read from the
    graph) into `path`; the operators it fused, by count. An encoder it cannot read is
    quantised unfused: None, with a warning. Either way the export's serving check then
    compares the int8 graph with torch."""
    from onnxruntime.transformers.optimizer import optimize_model  # startup

    try:
        optimized = optimize_model(str(source), model_type="bert", num_heads=0, hidden_size=0)
    except Exception as error:  # noqa: BLE001 - any failure leaves the unfused graph
        log.warning("int8 graph: onnxruntime's optimizer failed (%s); quantising unfused", error)
        return None
    optimized.save_model_to_file(str(path))
    counts = optimized.get_fused_operator_statistics()
    return {name: int(count) for name, count in sorted(counts.items()) if count}


def _not_preprocessing_advice(record: logging.LogRecord) -> bool:
    return "pre-processing before quantization" not in record.getMessage()


def _versions() -> dict[str, str]:
    import onnx
    import onnxruntime
    import sentence_transformers
    import transformers

    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "sentence_transformers": sentence_transformers.__version__,
        "onnx": onnx.__version__,
        "onnxruntime": onnxruntime.__version__,
    }
