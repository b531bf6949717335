"""Tiny random-init configurations of the transformers MoE families, for the experts-backend
tests (tests/test_transformers.py): each family's own config class, shrunk."""

from __future__ import annotations

# applied when the family's config class has the attribute
SMALL = {
    "vocab_size": 96,
    "hidden_size": 32,
    "intermediate_size": 48,
    "moe_intermediate_size": 16,
    "shared_expert_intermediate_size": 16,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "max_position_embeddings": 64,
    "num_local_experts": 6,
    "num_experts": 6,
    "n_routed_experts": 6,
    "moe_num_experts": 6,
    "num_experts_per_tok": 2,
    "moe_k": 2,
    "n_group": 1,
    "topk_group": 1,
    "first_k_dense_replace": 0,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "kv_lora_rank": 16,
    "q_lora_rank": 16,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 8,
    "v_head_dim": 8,
    "layer_types": None,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "tie_word_embeddings": False,
    "n_shared_experts": 1,
}

# family -> extra keyword arguments (after SMALL)
OVERRIDES: dict[str, dict] = {
    "bailing_hybrid": {"layer_group_size": 2},
    "beam": {"mlp_layer_types": ["dense", "sparse"]},
    "granitemoehybrid": {"mamba_n_heads": 8, "layer_types": ["mamba", "attention"]},
    "jamba": {
        "attn_layer_period": 2,
        "attn_layer_offset": 1,
        "expert_layer_period": 1,
        "expert_layer_offset": 0,
    },
    "kimi_linear": {
        "layer_types": ["linear_attention", "full_attention"],
        "mlp_layer_types": ["sparse", "sparse"],
    },
    "kolibri1_1": {"head_dim": 16, "index_num_heads": 2},
    "lfm2_moe": {"num_dense_layers": 0, "layer_types": ["conv", "full_attention"]},
    "nemotron_h": {
        "layer_types": ["linear_attention", "moe", "full_attention", "moe"],  # (mamba, attention)
        "num_hidden_layers": 4,
        "mamba_num_heads": 8,
        "mamba_head_dim": 8,
        "n_groups": 1,
    },
    "qwen3_next": {"layer_types": ["linear_attention", "full_attention"]},
    "qwen3_5_moe.text": {"layer_types": ["linear_attention", "full_attention"]},
    "qwen4_exp.text": {
        "layer_types": ["linear_attention", "full_attention"],
        "indexer_n_heads": 2,
        "indexer_kv_heads": 1,
        "indexer_head_dim": 8,
        "indexer_budget": 8,
        "indexer_compress_ratio": 4,
    },
    "zaya": {"num_experts_per_tok": 1},
}

# families whose causal LM cannot be built small: family -> why
UNBUILDABLE = {
    "dots3_note": "its causal LM includes a vision adapter whose width must match the text "
    "model's, fixed by its vision config",
}

# experts classes that their model builds from a part of its config: class -> why
UNBUILDABLE_EXPERTS = {
    "Ernie4_5_VLMoeMoeExperts": "built by its model with one entry of a per-modality size list",
    "Qwen3OmniMoeTalkerTextExperts": "built from the talker's part of a nested config",
    "Qwen3OmniMoeThinkerTextExperts": "built from the thinker's part of a nested config",
}

# the default subset: diverse layouts (biases, transposed and interleaved weights, non-gated
# experts, shared experts, grouped routing, hybrid attention and state-space layers) that run
# in well under a minute together
DEFAULT = (
    "mixtral",
    "qwen2_moe",
    "qwen3_moe",
    "olmoe",
    "deepseek_v3",
    "gpt_oss",
    "glm4_moe",
    "granitemoe",
    "phimoe",
    "ernie4_5_moe",
    "qwen3_next",
    "dots1",
    "minimax",
    "jamba",
    "nemotron_h",
    "hunyuan_v1_moe",
)


def families():
    """Model types whose modeling code uses ``use_experts_implementation`` and that have a
    causal-LM class, sorted."""
    import pathlib

    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    root = pathlib.Path(transformers.__file__).parent / "models"
    found = set()
    for path in root.glob("*/modeling_*.py"):
        if "use_experts_implementation" in path.read_text(encoding="utf-8"):
            found.add(path.parent.name)
    return sorted(f for f in found if f in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def tiny_config(family):
    """The family's config class with SMALL (where it has the attribute) and OVERRIDES."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    cls = CONFIG_MAPPING[family]
    kwargs = _small(cls(), family)
    kwargs.update(OVERRIDES.get(family, {}))
    config = cls(**kwargs)
    if not hasattr(config, "vocab_size") and hasattr(config, "text_config"):
        config = config.text_config  # the causal LM of these families takes the text part
    config._attn_implementation = "eager"
    return config


def _small(default, family):
    kwargs = {
        k: v
        for k, v in SMALL.items()
        if _has(default, k) and not isinstance(getattr(type(default), k, None), property)
    }
    if _has(default, "per_layer_config"):  # heterogeneous layers: keep them all alike
        kwargs["per_layer_config"] = None
    if "kv_lora_rank" in kwargs:  # multi-head latent attention: one key head per query head
        kwargs["num_key_value_heads"] = kwargs["num_attention_heads"]
    text = getattr(default, "text_config", None)
    if text is not None and hasattr(text, "to_dict"):
        small = {**_small(text, family), **OVERRIDES.get(family + ".text", {})}
        kwargs["text_config"] = {**text.to_dict(), **small}
    return kwargs


def _has(config, name):
    try:
        return hasattr(config, name)
    except Exception:  # a per-layer attribute of a heterogeneous config refuses global reads
        return name in config.to_dict()


def parameter_count(config):
    """Parameters of the causal LM of ``config``, counted on the meta device."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def experts_classes():
    """(family, class name) of every experts class that ``use_experts_implementation``
    decorates, multimodal families included, sorted."""
    import importlib
    import pathlib

    import transformers

    root = pathlib.Path(transformers.__file__).parent / "models"
    found = []
    for path in sorted(root.glob("*/modeling_*.py")):
        if "use_experts_implementation" not in path.read_text(encoding="utf-8"):
            continue
        family = path.parent.name
        module = importlib.import_module(f"transformers.models.{family}.{path.stem}")
        for name, obj in sorted(vars(module).items()):
            decorated = hasattr(getattr(obj, "__init__", None), "__wrapped__")
            if isinstance(obj, type) and obj.__module__ == module.__name__ and decorated:
                if hasattr(obj, "_apply_gate"):
                    found.append((family, name))
    return found


def tiny_text_config(family):
    """:func:`tiny_config`'s text part where the family's config has one. Where that config
    does not build small (multimodal configs check their parts against each other), the
    default config's text part with only the experts' own sizes shrunk."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    cls = CONFIG_MAPPING[family]
    try:
        kwargs = _small(cls(), family)
        kwargs.update(OVERRIDES.get(family, {}))
        config = cls(**kwargs)
    except Exception:
        config = cls()
        text = getattr(config, "text_config", None) or config
        for name in EXPERT_SIZES:
            if _has(text, name) and getattr(text, name) is not None:
                value = getattr(text, name)
                small = [SMALL[name]] * len(value) if isinstance(value, list) else SMALL[name]
                object.__setattr__(text, name, small)
    return getattr(config, "text_config", None) or config


# what an experts module reads of its config
EXPERT_SIZES = (
    "hidden_size",
    "intermediate_size",
    "moe_intermediate_size",
    "num_local_experts",
    "num_experts",
    "n_routed_experts",
    "moe_num_experts",
    "num_experts_per_tok",
    "moe_k",
)
