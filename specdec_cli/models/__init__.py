"""Models and their files: models.toml (`registry`), the hub (`hub`), the models packaged on PyPI
(`packaged`), and choosing and loading a pair (`loading`). What a GGUF file says is `engine/gguf.py`."""
