"""The built-in Hugging Face families, one small module each (see :class:`specformer_hf.Family`)."""

from __future__ import annotations

from specformer_hf.family import Family


def builtin_families() -> list[Family]:
    """In export preference order: when several families express a spec, the first wins."""
    # late: the family modules import torch (through their weight rules) and are needed only when families are listed
    from specformer_hf.families import (  # one per line: families are added side by side
        arcee,
        codegen,
        cohere,
        cohere2,
        cwm,
        deepseek_v2,
        deepseek_v3,
        deepseek_v32,
        deepseek_v4,
        ernie4_5,
        ernie4_5_moe,
        exaone,
        exaone4,
        falcon,
        gemma,
        gemma2,
        gemma3,
        gemma4,
        glm,
        glm4,
        glm4_moe,
        gpt2,
        gpt_bigcode,
        gpt_neo,
        gpt_neox,
        gpt_oss,
        gpt_sw3,
        gptj,
        granite,
        granitemoe,
        granitemoeshared,
        helium,
        internlm3,
        iquestcoder,
        llama,
        llama4,
        minicpm3,
        minimax_m2,
        ministral,
        mistral,
        mixtral,
        mpt,
        olmo2,
        olmo3,
        olmoe,
        opt,
        param2moe,
        phi,
        phi3,
        qwen2,
        qwen2_moe,
        qwen3,
        qwen3_moe,
        sarvam_mla,
        sarvam_moe,
        seed_oss,
        smollm3,
        stablelm,
        starcoder2,
        youtu,
    )
    # The hybrid families (recurrent mixers beside attention), after every all-attention one.
    from specformer_hf.families import (falcon_h1, falcon_mamba, granitemoehybrid, kimi_linear, lfm2, mamba, mamba2,
                                        nemotron_h, olmo_hybrid, qwen3_5, qwen3_5_moe, qwen3_next)

    return [gpt2.FAMILY, gpt_neox.FAMILY, llama.FAMILY, mistral.FAMILY, mixtral.FAMILY, qwen2.FAMILY, qwen3.FAMILY,
            gemma.FAMILY, gemma2.FAMILY, phi3.FAMILY, olmo2.FAMILY, stablelm.FAMILY,
            qwen2_moe.FAMILY, qwen3_moe.FAMILY, smollm3.FAMILY,
            gemma3.FAMILY, gpt_oss.FAMILY, deepseek_v3.FAMILY, deepseek_v32.FAMILY, deepseek_v4.FAMILY,
            cohere2.FAMILY, glm4_moe.FAMILY, minimax_m2.FAMILY, olmo3.FAMILY, exaone4.FAMILY, llama4.FAMILY, gemma4.FAMILY,
            phi.FAMILY, gpt_bigcode.FAMILY, gptj.FAMILY, falcon.FAMILY,
            qwen3_next.FAMILY, qwen3_5.FAMILY, qwen3_5_moe.FAMILY, olmo_hybrid.FAMILY, kimi_linear.FAMILY,
            lfm2.FAMILY, mamba2.FAMILY, nemotron_h.FAMILY, granitemoehybrid.FAMILY, falcon_h1.FAMILY,
            # The long tail (issue 44): after every family above, so that no spec's export changes.
            starcoder2.FAMILY, olmoe.FAMILY,
            # transformers runs these as Llama: Llama writes every spec they express.
            exaone.FAMILY, internlm3.FAMILY, iquestcoder.FAMILY,
            cohere.FAMILY,
            ernie4_5.FAMILY,
            ernie4_5_moe.FAMILY,
            glm.FAMILY,
            glm4.FAMILY,
            granite.FAMILY,
            granitemoe.FAMILY,
            granitemoeshared.FAMILY,
            deepseek_v2.FAMILY,
            minicpm3.FAMILY,
            youtu.FAMILY,
            mpt.FAMILY,
            arcee.FAMILY,
            opt.FAMILY,
            gpt_neo.FAMILY,
            codegen.FAMILY,
            gpt_sw3.FAMILY,
            sarvam_mla.FAMILY,
            param2moe.FAMILY,
            sarvam_moe.FAMILY,
            helium.FAMILY,
            seed_oss.FAMILY,
            ministral.FAMILY,
            cwm.FAMILY,
            # The recurrent mixers of issue 45.
            mamba.FAMILY, falcon_mamba.FAMILY,
            # Read only: a multimodal Qwen3.5 checkpoint's language model (export writes the text families above).
            qwen3_5.MULTIMODAL, qwen3_5_moe.MULTIMODAL, gemma4.MULTIMODAL]


__all__ = ["builtin_families"]
