"""Who is writing: bearer tokens in the kubeconfig mapped to a user, as an authenticator would.

The sandbox authorizes nothing (RBAC objects are stored, not enforced), but admission policies
decide on ``request.userInfo``: "only the operator's service account may write these annotations".
So each request is attributed to a user from its ``Authorization: Bearer`` token. A request with no
token, or one the sandbox does not know, is the cluster admin: every existing client (the default
kubeconfig's token is not registered) behaves exactly as before.

In-process conveniences (``Sandbox.patch``...) are no request, have no user and skip admission.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from deviceshare.api import names


@dataclasses.dataclass(frozen=True)
class User:
    username: str
    groups: tuple[str, ...] = ("system:authenticated",)
    # What the authenticator adds, e.g. a pod-bound service-account token's node: NODE_NAME_EXTRA -> [node].
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def info(self) -> dict[str, object]:
        """``request.userInfo`` as admission sees it."""
        return {"username": self.username, "groups": list(self.groups), "extra": {k: list(v) for k, v in self.extra}}


ADMIN = User("system:admin", ("system:masters", "system:authenticated"))


def service_account(namespace: str, name: str) -> User:
    return User(
        f"system:serviceaccount:{namespace}:{name}",
        ("system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"),
    )


# kube-apiserver (1.30+, ServiceAccountTokenPodNodeInfo) puts the node of the pod a service-account token is
# bound to in the user's extra info under this key: how a policy keeps a DaemonSet's pod to its own node.
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"


def bound_to_node(user: User, node: str) -> User:
    """``user`` as it authenticates with a token bound to a pod on ``node``."""
    return dataclasses.replace(user, extra=((NODE_NAME_EXTRA, (node,)),))


# The accounts manifests/base creates: the policy names the operator's, tests act as the others.
OPERATOR = service_account(names.DEFAULT_NAMESPACE, "deviceshare-operator")
TENANT = User("tenant-alice", ("tenants", "system:authenticated"))

# Tokens every sandbox knows (a test or the demo adds more with ``Sandbox(users=...)``).
OPERATOR_TOKEN = "deviceshare-operator-token"
TENANT_TOKEN = "deviceshare-tenant-token"
DEFAULT_TOKENS: Mapping[str, User] = {OPERATOR_TOKEN: OPERATOR, TENANT_TOKEN: TENANT}


def from_authorization(header: str | None, tokens: Mapping[str, User]) -> User:
    """The user a request's ``Authorization`` header names; the admin when it names none we know."""
    if header and header[:7].lower() == "bearer ":
        found = tokens.get(header[7:].strip())
        if found is not None:
            return found
    return ADMIN
