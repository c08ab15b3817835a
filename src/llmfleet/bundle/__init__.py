"""Air-gapped sites: one folder (a bundle) with the pinned images as archives, the models with their
manifests, images.lock and the catalogs, and ``bundle.json`` naming every file with its size and
sha256. ``contents`` is pure (layout, top manifest, checks); ``create`` and ``load`` are the shell."""
