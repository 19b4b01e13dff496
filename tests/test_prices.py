"""Prices: genai-prices' data for OpenAI's and Anthropic's models, the user's prices winning over
it, and no price (never a guess, never an exception) for a model neither knows."""

from __future__ import annotations

from decimal import Decimal
from importlib.metadata import version

import pytest
from genai_prices import Usage, calc_price
from genai_prices.data_snapshot import DataSnapshot, get_snapshot, set_custom_snapshot
from genai_prices.types import ClauseEquals, ModelInfo, ModelPrice, PriceVariant, Provider

import batchjson
from batchjson._errors import ConfigError
from batchjson._providers.pricing import Price, batch_share, cost_of, price_for, set_prices

BATCH = {"processing": "batch"}


def _data_cost(model: str, provider: str, context: dict[str, str] | None = None,
               **usage: int) -> float:
    """What genai-prices itself computes for a call (its input_tokens count cache tokens too)."""
    return float(calc_price(Usage(**usage), model, provider_id=provider,
                            price_context=context).total_price)


def test_a_known_models_cost_is_what_the_price_data_says() -> None:
    usage = {"input_tokens": 1000, "cache_read_tokens": 400, "output_tokens": 100}
    assert cost_of("gpt-4o-mini", 1000, 100, cached_tokens=400) == pytest.approx(
        _data_cost("gpt-4o-mini", "openai", **usage))
    assert price_for("gpt-4o-mini-2024-07-18") == price_for("gpt-4o-mini")
    assert price_for("claude-sonnet-4-5-20250929") == price_for("claude-sonnet-4-5")
    assert price_for("gpt-4o-2024-05-13").input == 5.0  # the old snapshot keeps its own price
    assert cost_of("claude-sonnet-4-5", 250_000, 10) is None  # past its long-context tier
    assert batchjson.PRICES_AS_OF == f"genai-prices {version('genai-prices')}"
    assert not get_snapshot().from_auto_update  # the data shipped in the wheel, never fetched


def test_anthropic_cache_reads_and_writes_are_priced_at_their_own_rates() -> None:
    usage = {"input_tokens": 1000, "cache_read_tokens": 300, "cache_write_tokens": 200,
             "output_tokens": 100}
    cost = cost_of("claude-haiku-4-5", 1000, 100, cached_tokens=300, cache_write_tokens=200)
    assert cost == pytest.approx(_data_cost("claude-haiku-4-5", "anthropic", **usage))
    price = price_for("claude-haiku-4-5")
    assert price.cache_write > price.input > price.cached_input


@pytest.mark.parametrize("model", ["no-such-model", "gemini-2.5-flash", "mistral-large-latest",
                                   "llama-3.3-70b", "GPT-4O-MINI-FINETUNE:x", "\x00", "é" * 500])
def test_a_model_no_price_knows_costs_none(model: str) -> None:
    """Other hosts' models in the data too: a local server's model name is no other host's."""
    assert price_for(model) is None
    assert cost_of(model, 10, 10) is None and cost_of(None, 10, 10) is None


def test_a_users_price_wins_over_the_data() -> None:
    live = price_for("gpt-4o-mini")
    try:
        set_prices({"gpt-4o-mini": Price(1.0, 3.0), "house-model": Price(2.0, 4.0)})
        # the answering model's dated name bills at the user's price for its alias
        assert cost_of("gpt-4o-mini-2024-07-18", 1_000_000, 0) == pytest.approx(1.0)
        assert cost_of("house-model", 1_000_000, 0) == pytest.approx(2.0)
        # a provider's prices= win over set_prices
        assert cost_of("gpt-4o-mini", 0, 1, overrides={"gpt-4o-mini": (0.0, 5e6)}) == 5.0
    finally:
        set_prices({}, replace=True)
    assert price_for("gpt-4o-mini") == live and price_for("house-model") is None
    with pytest.raises(ConfigError, match="input"):
        set_prices({"bad": {"in": 1}})


def test_a_batch_job_bills_the_providers_batch_price() -> None:
    for model, provider in (("gpt-4o-mini", "openai"), ("claude-haiku-4-5", "anthropic")):
        usage = {"input_tokens": 1000, "output_tokens": 100}
        batch = _data_cost(model, provider, BATCH, **usage)
        assert cost_of(model, 1000, 100) * batch_share(model) == pytest.approx(batch)
    assert batch_share("gpt-4o-mini", {"gpt-4o-mini": {"input": 1, "output": 2,
                                                       "batch": 0.3}}) == 0.3


def test_a_models_batch_share_is_its_own_in_the_data_else_half() -> None:
    """Read from the data, not assumed: a model whose batch price is 40% of live bills 40%."""
    def model(name: str, variants: list[PriceVariant] | None) -> ModelInfo:
        return ModelInfo(id=name, match=ClauseEquals(equals=name), price_variants=variants,
                         prices=ModelPrice(input_mtok=Decimal(1), output_mtok=Decimal(2)))

    cheaper = PriceVariant(when=BATCH, prices=ModelPrice(input_mtok=Decimal("0.4"),
                                                         output_mtok=Decimal("0.8")))
    data = DataSnapshot(providers=[Provider(
        id="openai", name="OpenAI", api_pattern="", models=[
            model("gpt-probe-batch-forty", [cheaper]), model("gpt-probe-no-batch", None)])],
        from_auto_update=False)
    set_custom_snapshot(data)
    try:
        assert batch_share("gpt-probe-batch-forty") == pytest.approx(0.4)
        assert batch_share("gpt-probe-no-batch") == 0.5
    finally:
        set_custom_snapshot(None)
