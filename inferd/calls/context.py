"""What every network's call handlers share, in one record: the models a call routes to, the gate that
admits it, where its outcome is recorded, the server's phase, its request ids and its traces. HTTP's
APIs and gRPC's service are each built from one (`server`), and no constructor repeats the list."""

from __future__ import annotations

from dataclasses import dataclass

from ..admission.admission import Admission
from ..lifecycle import Lifecycle
from ..models.registry import Models
from ..observability.outcomes import Outcomes
from ..observability.tracing import Tracing
from .request_ids import RequestIds


@dataclass(frozen=True, slots=True)
class CallContext:
    models: Models
    admission: Admission
    outcomes: Outcomes
    lifecycle: Lifecycle
    ids: RequestIds
    tracing: Tracing | None = None  # (None: no call is traced)


class CallHandlers:
    """The base of a network's handlers: the context's parts as their own attributes (each is read per
    request: one lookup, not two), set in one place."""

    def __init__(self, context: CallContext) -> None:
        self.context = context
        self.models = context.models
        self.admission = context.admission
        self.outcomes = context.outcomes
        self.lifecycle = context.lifecycle
        self.ids = context.ids
        self.tracing = context.tracing
