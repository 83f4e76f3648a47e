"""The ``executor=ray-serve`` autoscaling options, checked at load: what a spec's query
string becomes in the deployment's ``autoscaling_config``, and the option named when a
value is wrong (no Ray needed)."""

from __future__ import annotations

import pytest

from zeroserve.models.loader import parse_spec
from zeroserve.runtime.ray.serve.deployment import DEFAULT_MAX_ONGOING_REQUESTS, parse_autoscaling


def test_spec_options_become_the_autoscaling_config() -> None:
    ref = parse_spec(
        "m=zeroserve.models.echo:EchoModel?executor=ray-serve&num_cpus=0.5"
        "&min_replicas=1&max_replicas=3&target_ongoing_requests=2&downscale_delay_s=2.5"
    )
    placement = ref.runtime["placement"]
    auto = parse_autoscaling(placement)
    assert (auto.min_replicas, auto.max_replicas) == (1, 3)
    assert auto.max_ongoing_requests == DEFAULT_MAX_ONGOING_REQUESTS
    assert dict(auto.config) == {
        "min_replicas": 1,
        "max_replicas": 3,
        "target_ongoing_requests": 2,
        "downscale_delay_s": 2.5,
    }
    assert placement["num_cpus"] == 0.5  # left for the replicas' Ray placement


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"min_replicas": 3, "max_replicas": 2}, "max_replicas"),
        ({"max_replicas": 1.5}, "max_replicas"),
        ({"min_replicas": True}, "min_replicas"),
        ({"target_ongoing_requests": -1}, "target_ongoing_requests"),
        ({"max_ongoing_requests": 0}, "max_ongoing_requests"),
        ({"upscale_delay_s": "soon"}, "upscale_delay_s"),
    ],
)
def test_a_bad_value_names_its_option(options: dict[str, object], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        parse_autoscaling(options)
