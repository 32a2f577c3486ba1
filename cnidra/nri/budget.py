"""How long a hook may take: the share of the runtime's hook timeout a pod's ADDs may use
inside a hook, the time its rollback DELs must be done by, and the budget of ADDs that run
behind the sandbox, where no hook's answer waits on them."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from cnidra.cni.attach import Budget
from cnidra.cni.invoke import Deadline

log = logging.getLogger(__name__)

# containerd's default NRI plugin_request_timeout; the runtime tells the real one in Configure.
DEFAULT_REQUEST_TIMEOUT = 2.0
# Of the runtime's hook timeout: ADDs may use 60 %, rollback DELs must be done by 90 %, so the
# hook answers before containerd gives up on cnidra (it would start the sandbox without the
# interfaces and drop the connection).
ATTACH_SHARE = 0.6
ANSWER_SHARE = 0.9
# all of a pod's ADDs behind its sandbox, unless --attach-budget says otherwise: the driver
# passes its plugin timeout (--cni-timeout)
DEFAULT_BEHIND_SANDBOX = 10.0


@dataclass
class HookBudget:
    """How long one hook may take. Inside a hook, `attach` 0 derives the ADD budget from the
    runtime's request timeout, and a configured value above what fits is cut down to fit.
    Behind the sandbox (the RunPodSandbox hook has answered; the pod's CreateContainer waits
    for the ADDs, and fails and is tried again while they run) no hook's answer waits on the
    ADDs: they get `attach` when set, else `behind` (the plugin timeout), so a node slowed
    down by a burst or a restart does not kill ADDs that would have finished, only to do them
    again at the next try."""

    attach: float = 0.0
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT
    behind: float = DEFAULT_BEHIND_SANDBOX

    @property
    def answer_seconds(self) -> float:
        return self.request_timeout * ANSWER_SHARE

    @property
    def attach_seconds(self) -> float:
        fits = self.request_timeout * ATTACH_SHARE
        return min(self.attach, self.answer_seconds) if self.attach > 0 else fits

    @property
    def behind_seconds(self) -> float:
        return self.attach if self.attach > 0 else self.behind

    def set_request_timeout(self, seconds: float) -> None:
        """The runtime's hook timeout, from NRI's Configure."""
        self.request_timeout = seconds
        if self.attach > self.answer_seconds:
            log.warning(
                "--attach-budget %.2fs does not fit the runtime's %.2fs hook timeout; using %.2fs",
                self.attach,
                seconds,
                self.attach_seconds,
            )

    def deadlines(self, *, behind_sandbox: bool = False) -> Budget:
        if behind_sandbox:
            return Budget(
                add=Deadline.after(self.behind_seconds, "the pod's attach budget"),
                rollback=Deadline.after(self.behind_seconds, "the pod's rollback budget"),
            )
        return Budget(
            add=Deadline.after(self.attach_seconds, "the pod's attach budget"),
            rollback=self.answer_by(),
        )

    def answer_by(self) -> Deadline:
        return Deadline.after(self.answer_seconds, "the runtime's hook timeout")
