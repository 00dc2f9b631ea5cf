"""After training: a checkpoint exported to the Hugging Face Llama layout (`coppelius export`),
text sampled through that export with `transformers` (`coppelius sample`), and the mean per-token
loss over a token cache's contexts (`coppelius eval`).

`llama.py` is the mapping (the tensor names, the two folds, config.json), `tokenizer_files.py` the
tokenizer files, `writer.py` the export directory, `generate.py` the sampling, `evaluate.py` the
loss (the numpy reference on the CPU, a backend's forward submission on the device)."""
