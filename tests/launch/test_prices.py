"""Live SageMaker training prices from the AWS Price List API, against botocore's Stubber.

The replies follow the Price List's documented product format (one JSON document per
product: `product.attributes` with `usagetype`, `terms.OnDemand.*.priceDimensions.*`
with `unit` and `pricePerUnit.USD`); they are built here, not recorded from AWS.
"""

from __future__ import annotations

import datetime
import json
import re

import boto3
import pytest
from botocore.stub import Stubber

from hetrl.launch import prices
from hetrl.launch.prices import fetch_live_prices, live_prices, load_prices

NOW = datetime.datetime(2026, 12, 1, tzinfo=datetime.timezone.utc)
REQUEST = {"ServiceCode": "AmazonSageMaker", "FormatVersion": "aws_v1",
           "Filters": [{"Type": "TERM_MATCH", "Field": "regionCode", "Value": "eu-west-1"}]}


@pytest.fixture(autouse=True)
def offline(aws_offline, monkeypatch, tmp_path):
    """No network (conftest.aws_offline) and a cache of the test's own."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def product(usagetype: str, usd: str, unit: str = "Hrs", vcpu: str = "") -> str:
    attributes = {"usagetype": usagetype, "regionCode": "eu-west-1",
                  "servicecode": "AmazonSageMaker"}
    if vcpu:
        attributes["vCpu"] = vcpu
    return json.dumps({
        "product": {"productFamily": "ML Instance", "sku": "SKU1", "attributes": attributes},
        "serviceCode": "AmazonSageMaker",
        "terms": {"OnDemand": {"SKU1.JRTCKXETXF": {"priceDimensions": {
            "SKU1.JRTCKXETXF.6YS6EN2CT7": {"unit": unit, "pricePerUnit": {"USD": usd},
                                          "description": "per hour"}}}}}})


def stubbed_client(pages: list[list[str]]):
    client = boto3.client("pricing", region_name="us-east-1")
    stub = Stubber(client)
    for i, page in enumerate(pages):
        reply = {"FormatVersion": "aws_v1", "PriceList": page}
        params = dict(REQUEST)
        if i + 1 < len(pages):
            reply["NextToken"] = f"page-{i + 1}"
        if i:
            params["NextToken"] = f"page-{i}"
        stub.add_response("get_products", reply, params)
    stub.activate()
    return client, stub


def test_only_on_demand_training_usage_types_are_read() -> None:
    client, stub = stubbed_client([
        [product("EU-Train:ml.c5.9xlarge", "2.0520000000", vcpu="36"),
         product("EU-Host:ml.c5.9xlarge", "2.1000000000"),        # hosting, not training
         product("EU-Train:ml.c5.9xlarge-Spot", "0.6"),           # not on-demand training
         product("EU-Notebk:ml.g5.2xlarge", "1.9")],
        [product("EU-Train:ml.g5.2xlarge", "1.7140000000"),
         product("EU-Train:ml.g5.xlarge", "0.0000000000")]])     # no price: skipped
    found = fetch_live_prices(client, "eu-west-1", NOW)
    stub.assert_no_pending_responses()
    assert found == {
        "ml.c5.9xlarge": {"price_per_hour": 2.052, "read": "2026-12-01", "vcpus": 36,
                          "source": "AWS Price List API, AmazonSageMaker, eu-west-1, usage type "
                                    "EU-Train:ml.c5.9xlarge, on-demand"},
        "ml.g5.2xlarge": {"price_per_hour": 1.714, "read": "2026-12-01",
                          "source": "AWS Price List API, AmazonSageMaker, eu-west-1, usage type "
                                    "EU-Train:ml.g5.2xlarge, on-demand"}}


def test_live_prices_are_cached_with_their_date_and_fall_back_with_a_line(capsys) -> None:
    client, stub = stubbed_client([[product("EU-Train:ml.c5.9xlarge", "2.052")]])
    first = live_prices("eu-west-1", client, NOW)
    stub.assert_no_pending_responses()
    assert first["ml.c5.9xlarge"]["price_per_hour"] == 2.052
    cached = json.loads(prices.cache_file("eu-west-1").read_text())
    assert cached["read"] == NOW.isoformat() and cached["region"] == "eu-west-1"
    # Within a day: from the cache, no request at all (this client has no stubbed reply).
    silent, _ = stubbed_client([])
    assert live_prices("eu-west-1", silent, NOW + datetime.timedelta(hours=23)) == first
    # A day later the cache is stale; AWS refuses (no permission): the shipped table, said.
    refusing = boto3.client("pricing", region_name="us-east-1")
    with Stubber(refusing) as stub:
        stub.add_client_error("get_products", "AccessDeniedException")
        assert live_prices("eu-west-1", refusing, NOW + datetime.timedelta(hours=25)) is None
    assert "live prices for eu-west-1 unavailable" in capsys.readouterr().err


def test_load_prices_live_merges_over_the_shipped_table(monkeypatch, capsys) -> None:
    client, _ = stubbed_client([[product("EU-Train:ml.c5.9xlarge", "2.052")]])
    monkeypatch.setattr(boto3, "client", lambda *a, **k: client)
    table = load_prices("live:eu-west-1")
    assert table.region == "eu-west-1"
    live = table.get("ml.c5.9xlarge")
    assert live.price_per_hour == 2.052 and live.vcpus == 36  # size from the shipped table
    assert live.source.startswith("AWS Price List API")
    assert table.get("ml.g5.2xlarge").price_per_hour == load_prices().get(
        "ml.g5.2xlarge").price_per_hour  # types the API did not list keep the table's price

    def unreachable(*args, **kwargs):
        raise OSError("no route to the Price List API")

    monkeypatch.setattr(boto3, "client", unreachable)
    fallback = load_prices("live:ap-south-1")
    assert fallback.region == "us-east-1"
    assert "using the shipped table" in capsys.readouterr().err


# The public sources a shipped price may cite: anyone can open them and find the figure.
PUBLIC_SOURCES = (
    "https://aws.amazon.com/sagemaker/pricing/",
    "https://pricing.us-east-1.amazonaws.com/offers/v1.0/aws/AmazonSageMaker/",
    "AWS Machine Learning Blog, 'Improve price performance of your model training using "
    "Amazon SageMaker heterogeneous clusters'",
)


def test_every_shipped_figure_cites_a_public_source_or_says_it_is_derived() -> None:
    data = json.loads(prices.PRICES_FILE.read_text())
    instances = data["instances"]
    for name, entry in instances.items():
        assert bool(entry.get("source")) != bool(entry.get("derived")), name
        if "source" in entry:
            assert any(source in entry["source"] for source in PUBLIC_SOURCES), name
            continue
        # A derivation names the published record it scales, and that record has a source.
        derived = re.fullmatch(r"derivation, not a published figure: (ml\.\S+) [\d.]+ "
                               r"\(see its record\) scaled linearly by vCPU \(\d+/\d+\).*",
                               entry["derived"])
        assert derived, f"{name}: {entry['derived']}"
        assert "source" in instances.get(derived.group(1), {}), name
