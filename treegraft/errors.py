"""The loading error every layer raises and every entry point turns into one clear message."""


class ModelLoadError(ValueError):
    """A model, tokenizer or trio could not be loaded; the message says why and what to do."""
