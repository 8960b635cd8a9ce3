"""Which configurations of the main alone a calibration measures again after a round."""

from inference.calibration.measure import Line, _contenders


def measured(tokens_per_s: float, *, streams: int = 1) -> Line:
    return Line(engine=None, streams=streams, tokens=int(tokens_per_s * 10), seconds=10.0)  # type: ignore[arg-type]


def test_a_configuration_far_behind_at_one_stream_and_under_load_is_not_measured_again():
    lines = {"f32-dynamic": (measured(11.4), measured(34.0, streams=4)),
             "bf16": (measured(9.5), measured(18.6, streams=4)),  # close enough at one stream
             "defaults": (measured(8.1), measured(30.0, streams=4)),  # close enough under load
             "f16": (measured(5.7), measured(14.7, streams=4))}
    kept = _contenders([line for pair in lines.values() for line in pair])
    assert kept == [line for name in ("f32-dynamic", "bf16", "defaults") for line in lines[name]]
