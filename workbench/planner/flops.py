"""FLOPs per token: what the kernels execute, what counts as model work, what papers report.

Three counts (:class:`TokenFlops`): *published* (PaLM's ``6N + 12 L h s``, most papers' MFU),
*model* (the planner's MFU: matmul parameters, causal attention halved) and *hardware*
(what flash or eager kernels and recompute execute, which drives the step time); the
formulas and their sources are in docs/planner.md."""

from __future__ import annotations

from dataclasses import dataclass

from .layout import PlanLayout
from .model_spec import ModelSpec


@dataclass(frozen=True)
class TokenFlops:
    """FLOPs per trained token, split by the peak they run at."""

    matmul: float  # parameter matmuls (fp8 peak under fp8, else the precision's)
    attention: float  # scores and their backward (bf16 peak, also under fp8)
    model: float  # the planner's model FLOPs (its MFU numerator)
    published: float  # 6N + 12 L h s (PaLM appendix B)
    published_hardware: float  # the same with recompute counted (Narayanan et al. 2021)

    @property
    def hardware(self) -> float:
        return self.matmul + self.attention


def attention_flops_per_token(model: ModelSpec) -> float:
    """12 * layers * hidden * seq_len (PaLM appendix B), forward + backward."""
    return 12 * model.layers * model.hidden * model.seq_len


def training_flops_per_token(n_params: float, layers: int = 0, hidden: int = 0, seq_len: int = 0) -> float:
    """6 N + 12 L h s (Kaplan et al. 2020, PaLM appendix B): the one formula the planner and
    the ranks' MFU both use (no attention term where the shape is not known)."""
    return 6.0 * n_params + 12 * layers * hidden * seq_len


def flops_per_token(model: ModelSpec, include_attention: bool = True) -> float:
    """Published model FLOPs per trained token: 6 N_active (+ the attention term)."""
    if not include_attention:
        return training_flops_per_token(model.params().active)
    return training_flops_per_token(model.params().active, model.layers, model.hidden, model.seq_len)


def matmul_params_per_layer(model: ModelSpec) -> float:
    """Active parameters of one layer that multiply activations (norm weights excluded)."""
    router = model.hidden * model.experts if model.is_moe else 0
    return model.attention_params_per_layer() + model.top_k * model.mlp_params_per_expert() + router


def head_params(model: ModelSpec) -> float:
    """The output projection (vocab x hidden), a matmul whether tied or not."""
    return model.vocab * model.hidden


def matmul_params(model: ModelSpec) -> float:
    """N_matmul: layers' matmul parameters plus the output head."""
    return model.layers * matmul_params_per_layer(model) + head_params(model)


def attention_hardware_per_layer(model: ModelSpec, attention: str) -> tuple[float, float]:
    """(forward, forward + backward) attention FLOPs per token per layer the kernel runs."""
    sh = model.seq_len * model.hidden
    if attention == "flash":
        return 2 * sh, 7 * sh
    return 4 * sh, 12 * sh


def token_flops(model: ModelSpec, layout: PlanLayout) -> TokenFlops:
    """All three counts for one layout (its attention kernel and recompute)."""
    nm = matmul_params(model)
    layers = model.layers
    forward, total = attention_hardware_per_layer(model, layout.attention)
    matmul = 6 * nm
    attention = total * layers
    if layout.recompute == "full":  # the layers' forward again; the head is not recomputed
        matmul += 2 * layers * matmul_params_per_layer(model)
        attention += forward * layers
    elif layout.recompute == "selective" and layout.attention == "eager":
        attention += forward * layers
    published = flops_per_token(model)
    lhs = model.layers * model.hidden * model.seq_len
    if layout.recompute == "full":
        published_hw = published + 2 * model.params().active + 4 * lhs
    elif layout.recompute == "selective":
        published_hw = published + 4 * lhs
    else:
        published_hw = published
    return TokenFlops(
        matmul=matmul,
        attention=attention,
        model=6 * nm + 6 * model.layers * model.hidden * model.seq_len,
        published=published,
        published_hardware=published_hw,
    )


def layer_and_head_seconds(
    model: ModelSpec, layout: PlanLayout, matmul_rate: float, attention_rate: float
) -> tuple[float, float]:
    """Seconds per token of one layer and of the output head at the given FLOP rates."""
    recompute_matmul = 8 if layout.recompute == "full" else 6
    forward, total = attention_hardware_per_layer(model, layout.attention)
    attention = total + (
        forward
        if layout.recompute == "full" or (layout.recompute == "selective" and layout.attention == "eager")
        else 0
    )
    layer = recompute_matmul * matmul_params_per_layer(model) / matmul_rate + attention / attention_rate
    head = 6 * head_params(model) / matmul_rate
    return layer, head
