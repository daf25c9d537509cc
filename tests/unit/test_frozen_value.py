"""``frozen_value`` builds the same values as the classes' own ``__init__``, or refuses."""

from __future__ import annotations

import dataclasses

import pytest

from jobs.core.policy import TenantLoad, Tier
from jobs.index.memory_layout import frozen_value
from jobs.index.values import Admission, AdmissionTerms, IndexedJob, Lease

pytestmark = pytest.mark.unit

TIER = Tier(name="gold", base_priority=0, max_wait_s=5, tenant_share=0.25)
VALUES = [
    IndexedJob(job_id="0000000001", tenant="acme", tier="gold", order_key=1.5, start_by=9.0),
    AdmissionTerms(now=2.0, tier=TIER, mean_service_s=6.0, service_samples_min=20,
                   tenant_cap=3, max_wait_s=7.0),
    Admission(accepted=False, reason="capacity", duplicate=False, position=4, tier_queued=5,
              tenant_queued=2, tenant_inflight=1, capacity=24, inflight=24,
              measured=(6.1, 200), next_token_s=0.0, bound=5, quota=1, max_position=None,
              starts_ahead=4),
    Lease(job_id="0000000002", tenant="acme", tier="gold", order_key=3.0, expires_at=33.0),
    TenantLoad(cap=2, inflight=1, ahead=0),
]


@pytest.mark.parametrize("value", VALUES, ids=lambda v: type(v).__name__)
def test_the_same_value_as_the_constructor_builds(value: object) -> None:
    fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}  # type: ignore[arg-type]
    built = frozen_value(type(value), **fields)
    assert built == value
    assert hash(built) == hash(value)
    assert repr(built) == repr(value)
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.job_id = "x"  # type: ignore[attr-defined]


def test_every_field_must_be_given() -> None:
    with pytest.raises(TypeError, match="every field"):
        frozen_value(Lease, job_id="1", tenant="acme", tier="gold", order_key=1.0,
                     expires_at=2.0)
