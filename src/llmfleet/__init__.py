"""llmfleet: put LLM inference servers onto GPU hosts over SSH and keep them healthy."""

__version__ = "0.1.0"
