"""tealite: TransformerEngine-style kernels (GEMM, norms, activations, quantization) for
ROCm/AITER, Triton, torch._scaled_mm and PyTorch, behind one functional op API."""
from tealite.errors import BackendUnavailable, TealiteArgumentError, UnsupportedCase
from tealite.ops.attention import AttentionBwd, AttentionFwd, attention_bwd, attention_fwd
from tealite.ops.activations import DbiasDact, act_bwd, act_fwd, dbias_dact
from tealite.ops.dropout import DropoutFwd, dropout_bwd, dropout_fwd
from tealite.ops.fused import act_fwd_quantize, layernorm_fwd_quantize, rmsnorm_fwd_quantize
from tealite.ops.gemm import GemmOutput, gemm
from tealite.ops.grouped_gemm import grouped_gemm, grouped_qgemm
from tealite.ops.grouped_quantize import grouped_quantize
from tealite.moe_types import GroupedQuantized
from tealite.ops.layouts import (shuffle_e8m0_scales, shuffle_weight, unshuffle_e8m0_scales,
                                 unshuffle_weight)
from tealite.ops.norms import (AddRMSNormPad, add_rmsnorm_pad, layernorm_bwd, layernorm_fwd,
                               rmsnorm_bwd, rmsnorm_fwd)
from tealite.ops.qgemm import QGemmOutput, qgemm
from tealite.ops.moe_ffn import moe_ffn_fwd
from tealite.ops.multi_tensor import (multi_tensor_adam, multi_tensor_compute_scale,
                                      multi_tensor_l2norm, multi_tensor_scale, multi_tensor_sgd,
                                      multi_tensor_unscale_l2norm)
from tealite.ops.permute import (PaddedRows, Permuted, SortedChunks, UnpermuteGrads,
                                 moe_pad_rows, moe_permute, moe_permute_and_pad,
                                 moe_sort_chunks, moe_unpad_rows,
                                 moe_unpermute, moe_unpermute_bwd)
from tealite.ops.rope import rope_bwd, rope_fwd
from tealite.ops.router import (moe_aux_loss_bwd, moe_aux_loss_fwd, router_aux_scores_bwd,
                                router_aux_scores_fwd, router_bwd, router_fwd)
from tealite.ops.quantize import (QuantizedTensor, amax, delayed_scaling_update, dequantize,
                                  quantize)
from tealite.ops.scaling import delayed_scaling_update_bulk
from tealite.ops.transpose import fp8_transpose, transpose
from tealite.ops.softmax import softmax_bwd, softmax_fwd
from tealite.modules import LayerNormLinear, LayerNormMLP, ModuleBackends
from tealite.registry import Backend, backends, get_backend, register_backend

__version__ = "0.1.0"

__all__ = [
    "gemm", "GemmOutput", "layernorm_fwd", "layernorm_bwd", "rmsnorm_fwd", "rmsnorm_bwd",
    "act_fwd", "act_bwd", "dbias_dact", "DbiasDact", "Backend", "register_backend",
    "backends", "get_backend", "quantize", "dequantize", "amax", "QuantizedTensor", "delayed_scaling_update",
    "qgemm", "QGemmOutput", "shuffle_weight", "unshuffle_weight", "shuffle_e8m0_scales",
    "unshuffle_e8m0_scales", "TealiteArgumentError", "BackendUnavailable", "UnsupportedCase",
    "layernorm_fwd_quantize", "rmsnorm_fwd_quantize", "act_fwd_quantize",
    "attention_fwd", "attention_bwd", "AttentionFwd", "AttentionBwd",
    "rope_fwd", "rope_bwd",
    "moe_permute", "moe_permute_and_pad", "moe_unpermute", "moe_unpermute_bwd", "moe_sort_chunks", "moe_pad_rows",
    "moe_unpad_rows", "Permuted", "UnpermuteGrads", "SortedChunks", "PaddedRows",
    "moe_ffn_fwd",
    "softmax_fwd", "softmax_bwd",
    "grouped_gemm", "grouped_qgemm", "grouped_quantize", "GroupedQuantized",
    "router_fwd", "router_bwd", "router_aux_scores_fwd", "router_aux_scores_bwd",
    "moe_aux_loss_fwd", "moe_aux_loss_bwd",
    "LayerNormLinear", "LayerNormMLP", "ModuleBackends",
    "dropout_fwd", "dropout_bwd", "DropoutFwd",
    "multi_tensor_scale", "multi_tensor_l2norm", "multi_tensor_unscale_l2norm",
    "multi_tensor_adam", "multi_tensor_sgd", "multi_tensor_compute_scale",
    "delayed_scaling_update_bulk", "transpose", "fp8_transpose",
    "add_rmsnorm_pad", "AddRMSNormPad",
]
