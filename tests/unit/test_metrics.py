"""The Prometheus text format of /metrics."""

from inference.metrics import _order, _sample


def test_metrics_text_format_orders_buckets():
    bucket = _sample("vllm:ttft_seconds_bucket", {"model_name": "p", "le": "0.5"})
    assert bucket == 'vllm:ttft_seconds_bucket{model_name="p",le="0.5"}'
    later = _sample("vllm:ttft_seconds_bucket", {"model_name": "p", "le": "2.5"})
    names = ("vllm:ttft_seconds_bucket",)
    assert sorted([later, bucket], key=lambda s: _order(s, names)) == [bucket, later]
