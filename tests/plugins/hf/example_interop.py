"""The worked example of docs/interop.md (included there verbatim; test_docs_example.py runs it)."""

import tempfile
from pathlib import Path

import torch
import transformers

import specformer
import specformer_hf

work = Path(tempfile.mkdtemp())

# 1. Any Hugging Face model directory will do; here a tiny random Llama made on the spot.
config = transformers.LlamaConfig(
    vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
)
torch.manual_seed(0)
hf_model = transformers.LlamaForCausalLM(config).eval()
hf_model.save_pretrained(work / "tiny-llama")

# 2. Import it: a specformer Decoder with the same weights and the same logits.
model = specformer_hf.from_hf(work / "tiny-llama")
print(model.spec.model.block.mixer.as_dict())
ids = torch.randint(0, 128, (2, 32))
with torch.no_grad():
    difference = (model(ids) - hf_model(ids).logits).abs().max().item()
print(f"largest logit difference: {difference:.1e}")

# 3. Change the architecture through the spec: every layer now attends to its last 8 tokens.
spec = model.spec.to_dict()
spec["model"]["block"]["mixer"]["window"] = 8
windowed = specformer.build(spec)
windowed.load_state_dict(model.state_dict())

# 4. Export. Llama has no sliding window, so the first family that can say it is chosen.
specformer_hf.to_hf(windowed, work / "tiny-windowed")
reloaded = transformers.AutoModelForCausalLM.from_pretrained(work / "tiny-windowed").eval()
with torch.no_grad():
    difference = (windowed(ids) - reloaded(ids).logits).abs().max().item()
print(f"exported as {type(reloaded).__name__}, largest logit difference: {difference:.1e}")
