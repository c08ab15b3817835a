"""Deploy one service over several hosts: its workers first, then its head; one health verdict; one rollback.

A service with ``workers:`` (``llmfleet.release.cluster`` says what each host runs) is deployed as a unit:

1. prepare (no SSH): the service with this run's overrides, its secret, the image each host pulls;
2. connect to every host of the service; read each host's cluster address (``llmfleet_cluster_address``
   or the IPv4 address of ``llmfleet_cluster_interface``; a public, loopback or wildcard one refuses);
   gather facts on every host; the head's preflight with the plan over all hosts, and
   ``preflight.check_service_hosts`` over all of them (identical cards, drivers, GPU counts, network);
3. render the head's and each worker's release; ``decide`` per host; ``check``/``diff`` stop here;
4. take the deploy lock on every host in a fixed order (sorted host names: two deploys that share hosts
   cannot each hold half); pull on every host while the old releases still serve;
5. upload every host's release and arm every host's revert timer before the first switch (workers,
   then the head, whose timer fires last: ``confirm.cluster_timeouts``); switch the workers (each
   checked: unit active, and for rpc-server its port open on the host itself); then, from the head, a
   bounded TCP connect to every worker's rpc-server endpoint (``cluster.reach_script``, one round trip):
   a worker the head cannot reach stops the deploy there, before the head switches; then the head: its
   staged health check, and the join check (llama.cpp: each worker named as an RPC device in the
   head's log, or holding an established connection from the head's address to its rpc-server; vLLM:
   Ray's live node count, asked in the head's container); then every host confirmed, workers first
   (each confirmation starts that host's watchdog);
6. any failure after the first switch puts every host of the service back: workers first (the head
   needs them to start), then the head, each on its previous release (or stopped when it had none),
   each host's timer stopped just before it goes back; a head that had not switched yet is restarted
   on its release (its workers' old containers are gone);
7. last round trip per host: health marks, prune, audit lines, unlock.

Steps 2 (connect), 3's diff and check, 4 and 7 are ``pipeline``'s stages, the same as a single host's;
the decisions across hosts (lock order, workers first, what a worker change means for the head, when a
head that never switched is restarted going back, the set's result) are ``decide``'s. This package is
the gather (2-3) and the switch (5-6) of a head and its workers, in four parts:

- ``plan``: before any SSH: the workers, what every host runs, the cluster the inventory tells;
- ``checks``: a worker's start check, the head reaching its workers, the join check;
- ``switch``: arm every host, switch workers then the head, confirm, commit, or every host back;
- ``run``: the deploy and the rollback, ``pipeline``'s stages around the gather and the switch.
"""

from llmfleet.release.multihost.checks import worker_health
from llmfleet.release.multihost.plan import (
    PreparedService,
    WorkerPrep,
    offline_cluster,
    prepare_service,
    release_endpoint,
    services_of_hosts,
    worker_conflicts,
    workers_of,
)
from llmfleet.release.multihost.run import deploy_service, rollback_service
from llmfleet.release.multihost.switch import ServiceRun

__all__ = ["PreparedService", "ServiceRun", "WorkerPrep", "deploy_service", "offline_cluster", "prepare_service",
           "release_endpoint", "rollback_service", "services_of_hosts", "worker_conflicts", "worker_health",
           "workers_of"]
