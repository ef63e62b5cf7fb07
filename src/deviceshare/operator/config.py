"""The operator's settings, read once at start-up and passed down explicitly (no config singletons)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

from deviceshare.api import envnames, handovers, names
from deviceshare.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class OperatorConfig:
    scheduler_name: str = names.DEFAULT_SCHEDULER_NAME
    namespace: str = names.DEFAULT_NAMESPACE
    env_names: envnames.EnvNames = dataclasses.field(default_factory=envnames.EnvNames)
    kubeconfig: str | None = None
    context: str | None = None  # kubeconfig context (None: the kubeconfig's current context)
    # How many pods may be in their API-write phase at once (decisions themselves are serial per group).
    workers: int = 32
    # Backoff for a pod that could not be placed: doubles from initial to max; any cluster change that
    # could help (node added, group released, pod gone) moves parked pods back sooner, after their backoff.
    backoff_initial: float = 1.0
    backoff_max: float = 60.0
    # Parked pods are retried at least this often, even if nothing visible changed.
    unschedulable_flush: float = 60.0
    # Coalesce bursts of member changes into one group status write.
    status_debounce: float = 0.05
    # A new group with no member pod yet gets its first status (Pending, WaitingForMembers) after this
    # long; usually its first pod comes sooner and the placement writes the first status instead.
    new_group_grace: float = 1.0
    # A member pod a group has waited on this long (to release its devices) is read again from the API,
    # in case its deletion never reached us (a watch that hangs without an error).
    member_recheck: float = 10.0
    # Every so often, pods and groups we hold that a fresh list lacks are read one by one and forgotten
    # if the API no longer has them (the same lost deletions, for objects nothing is waiting on).
    audit_interval: float = 300.0
    # A watch that brings nothing for this long (kube-apiserver sends a bookmark every minute, and one before
    # the watch's own end) is taken for a dead connection and resumed, on a new one, from its resourceVersion.
    watch_idle_timeout: float = 65.0
    # Leader election on a coordination.k8s.io/v1 Lease in ``namespace`` (client-go's rules and defaults):
    # None runs a single replica that schedules at once, with no election.
    lease_name: str | None = None
    lease_duration: float = 15.0  # how long a Lease counts as held without a renewal
    renew_deadline: float = 10.0  # a leader that has not renewed for this long stops scheduling
    retry_period: float = 2.0  # between tries to acquire or renew
    identity: str | None = None  # this replica's holderIdentity (generated when None)
    # A newly elected replica waits this long before rebuilding, so writes the previous leader had
    # already sent have landed and show in the API.
    election_settle: float = 2.0
    # A preemptor's nomination keeps the room being freed for it this long at most (CONTRACT §8: 60 s).
    nomination_ttl: float = 60.0
    # SharedDeviceGroups through Kopf's on.event handler (handlers.py) instead of our own reflector: off by default,
    # since it cost 1.6x the operator CPU per bound pod on one-pod groups (docs/architecture.md, issue 36).
    groups_through_kopf: bool = False
    # Kopf keeps a per-object worker this long after its last event (and waits for them when stopping).
    worker_idle_timeout: float = 5.0
    # Start-up: while the API does not answer, tries are spaced by a doubling delay capped here, so the
    # operator is working within seconds of the API coming up (Kopf's own retry waits 60 s).
    startup_backoff_initial: float = 0.5
    startup_backoff_max: float = 10.0
    metrics_host: str = "0.0.0.0"
    metrics_port: int | None = 8080
    # Shares are enforced by MPS (--mps): a compute or memory share of an NVIDIA device goes only to a node
    # that says deviceshare.io/mps: ready (CONTRACT §9; the node agent publishes it).
    mps: bool = False
    # How members' containers get their devices, per node (CONTRACT §12): --handover, --cdi-kind, the file.
    handovers: handovers.Handovers = dataclasses.field(default_factory=handovers.Handovers)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: object) -> OperatorConfig:
        env = os.environ if environ is None else environ
        base = cls(
            scheduler_name=env.get(names.ENV_SCHEDULER_NAME) or names.DEFAULT_SCHEDULER_NAME,
            namespace=env.get(names.ENV_NAMESPACE) or names.DEFAULT_NAMESPACE,
        )
        config = dataclasses.replace(base, **overrides)  # type: ignore[arg-type]
        config.check()
        return config

    def check(self) -> None:
        """Raise ``ConfigError`` for election timings that could let two leaders overlap."""
        if not 0 < self.retry_period < self.renew_deadline < self.lease_duration:
            raise ConfigError(
                "leader election needs 0 < --leader-elect-retry-period < --leader-elect-renew-deadline < "
                f"--leader-elect-lease-duration (got {self.retry_period:g} s, {self.renew_deadline:g} s, "
                f"{self.lease_duration:g} s): a leader must stop before its lease can expire"
            )
