import django.core.validators
from django.db import migrations, models


def streams_from_flag(apps, schema_editor):
    """A pair that served one stream on its own engine keeps doing exactly that."""
    apps.get_model("inference", "ModelPair").objects.filter(own_engine_at_one_stream=True).update(own_engine_streams=1)


def flag_from_streams(apps, schema_editor):
    apps.get_model("inference", "ModelPair").objects.filter(own_engine_streams__gt=0).update(
        own_engine_at_one_stream=True)


class Migration(migrations.Migration):

    dependencies = [
        ('inference', '0012_draft_steps'),
    ]

    operations = [
        migrations.AddField(
            model_name='modelpair',
            name='own_engine_streams',
            field=models.PositiveSmallIntegerField(default=0, help_text="While the pair runs at most this many answers on a worker, SpecChat's own engine serves them (greedy, sampled or the main alone; 0: never): one copy of the weights, and exact with the CPU's dynamic quantization (the fastest way to run an int8 main alone), which the library's speculative pipeline is not. It runs each answer on its own; beyond this many the library's pipelines serve, which batch them. Needs a draft model and the exact mode.", validators=[django.core.validators.MaxValueValidator(64)]),
        ),
        migrations.RunPython(streams_from_flag, flag_from_streams),
        migrations.RemoveField(
            model_name='modelpair',
            name='own_engine_at_one_stream',
        ),
    ]
