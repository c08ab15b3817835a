"""The bench's default levels: a module of their own, so that the task's help text needs no more."""

DEFAULT_CONCURRENCY = (1, 2, 4, 8)
DEFAULT_PROMPT_TOKENS = (128, 2048)
DEFAULT_MAX_TOKENS = 256
