"""Judging a running service: the staged health check of a started release (``check``), where the
model sits on the cards (``residency``), the fleet's own speed measurements and the floor they give
(``speed_history``, ``speed_overlay``, ``speed_cache``), and the host-side watchdog (``watchdog``).
The deploy pipeline (``llmfleet.release``) calls these; nothing here deploys."""
