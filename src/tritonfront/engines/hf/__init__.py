"""The transformers engine (`engine`: continuous batching in a thread of the model instance) and
what only it uses: per-request sampling inside the shared batch (`sampling`) and packed attention
without padding on CPU (`varlen_attention`). Imported only when the `llm` model's engine is hf."""
