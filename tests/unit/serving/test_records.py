"""A pair's engine spec for each route (the engine that serves it), and the decoding a plan gives a request."""

import pytest

from inference.engines.decoding import DecodingParams, Speculation
from inference.limits import Route
from inference.serving.planning import Plan, pair_default_route
from inference.serving.records import pair_spec, planned_decoding
from tests.unit.serving.planning import ALONE, LIB, LOOKS, LOOKUP, OWN, OWN_ALONE, OWN_K, pair


@pytest.mark.parametrize(("route", "engine", "quantized", "handed"), [
    (Route.LIBRARY_SPECULATIVE, Route.LIBRARY_SPECULATIVE, False, Speculation(k=4)),
    (Route.LIBRARY_MAIN_ALONE, Route.LIBRARY_MAIN_ALONE, False, None),
    (Route.OWN_SPECULATIVE, Route.OWN_SPECULATIVE, True, Speculation(k=4)),
    (Route.OWN_MAIN_ALONE, Route.OWN_SPECULATIVE, True, None),  # one engine: handed no speculation, the main alone
])
def test_each_route_names_the_engine_that_serves_it(route, engine, quantized, handed):
    spec = pair_spec(pair=pair(own_engine_streams=2), route=route)
    assert (spec.route, spec.dynamic_quantization) == (engine, quantized)
    assert planned_decoding(DecodingParams(max_new_tokens=8), Plan(route=route, k=4)).speculation == handed


@pytest.mark.parametrize(("fields", "engines"), [
    # each route asked -> the route of the engine that serves it, and whether that engine is the pair's default
    (OWN, {OWN_K: (OWN_K, True), OWN_ALONE: (OWN_K, True), LIB: (LIB, False), ALONE: (ALONE, False)}),
    ({}, {LIB: (LIB, True), OWN_K: (OWN_K, False), ALONE: (ALONE, False)}),
    (LOOKUP, {LIB: (LOOKS, True), ALONE: (ALONE, False)}),
    ({"draft_dir": ""}, {LIB: (ALONE, True), ALONE: (ALONE, True)}),  # nothing to draft with: one engine
])
def test_the_pairs_default_engine_is_the_one_its_default_route_builds(fields, engines):
    each = pair(**fields)
    assert {route: (pair_spec(pair=each, route=route).route, pair_spec(pair=each, route=route).is_pair_default)
            for route in engines} == engines
    assert pair_spec(pair=each, route=pair_default_route(each)).is_pair_default
