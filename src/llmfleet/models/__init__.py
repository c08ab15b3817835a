"""Model distribution: verified copies of a service's model at its ``model_path`` on each host
(``invoke models.push``): the manifest (``manifest``), the remote scripts and their parsers
(``scripts``), resumable sending (``transfer``) and the push itself (``push``)."""
