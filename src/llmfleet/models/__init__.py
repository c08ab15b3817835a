"""Model distribution: verified copies of a service's model at its ``model_path`` on each host
(``invoke models.push``): a model on this machine, hashed (``local``), and the push itself (``push``).
The manifest beside a model is ``knowledge.model_manifest`` (pure), the push's remote scripts
``host.model_scripts`` and the resumable sender ``host.transfer``."""
