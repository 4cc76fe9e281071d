"""What runs, experiments and registered models are called in MLflow: expected names are
written out by hand."""

import json

import pytest

from runtimes.tracking import naming


@pytest.mark.parametrize(
    ("rule", "key", "expected"),
    [
        ("drift-retrain", "acme-llama", "tuneloop.drift-retrain.acme-llama"),
        ("drift-retrain", "Model_7.v2", "tuneloop.drift-retrain.Model_7.v2"),
        ("nightly", "", "tuneloop.nightly"),
    ],
    ids=["dashes", "letters-digits-dots-underscores", "no-key"],
)
def test_a_plain_rule_and_key_keep_their_readable_name(rule, key, expected):
    assert naming.registered_model_name(rule, key) == expected


@pytest.mark.parametrize(
    ("rule", "key", "readable_part"),
    [
        ("drift-retrain", "acme/llama", "tuneloop.drift-retrain.acme-llama~"),
        ("drift-retrain", "tenant:7 model", "tuneloop.drift-retrain.tenant-7-model~"),
        ("Bad Rule", "k", "tuneloop.Bad-Rule.k~"),
    ],
    ids=["slash", "colon-and-space", "rule-outside-the-rule-grammar"],
)
def test_a_name_mlflow_would_refuse_is_cleaned_and_suffixed_with_a_hash(rule, key, readable_part):
    name = naming.registered_model_name(rule, key)
    assert name.startswith(readable_part)
    assert len(name) == len(readable_part) + 10
    # MLflow refuses '/' and ':' in registered model names.
    assert "/" not in name
    assert ":" not in name


def test_keys_that_clean_to_the_same_text_get_different_names():
    assert naming.registered_model_name("r", "acme/llama") != naming.registered_model_name(
        "r", "acme:llama"
    )


def test_a_rule_and_key_split_differently_never_share_a_name():
    # Without the dot rule (a rule name has no dot), "a-b"+"c" and "a"+"b-c" would collide.
    assert naming.registered_model_name("a-b", "c") == "tuneloop.a-b.c"
    assert naming.registered_model_name("a", "b-c") == "tuneloop.a.b-c"


def test_a_hashed_name_never_equals_a_readable_one():
    # '~' sets the hash off, and no readable name holds it.
    hashed = naming.registered_model_name("r", "k/1")
    assert "~" in hashed
    assert "~" not in naming.registered_model_name("r", hashed.split(".", 2)[2].replace("~", "-"))


def test_an_overlong_name_is_cut_and_stays_unique():
    first = naming.registered_model_name("r", "k" * 300)
    second = naming.registered_model_name("r", "k" * 299)
    assert len(first) <= naming.MAX_NAME_LENGTH
    assert first != second


def test_each_rule_has_its_own_experiment():
    assert naming.experiment_name("drift-retrain") == "tuneloop/drift-retrain"


def test_causing_event_ids_fit_a_tag_newest_kept_and_the_dropped_counted():
    ids = [f"event-{n:05d}-" + "x" * 90 for n in range(200)]  # ~20 KB of ids
    tags = naming.causing_ids_tags(ids)
    kept = json.loads(tags[naming.TAG_CAUSING_EVENT_IDS])
    assert len(tags[naming.TAG_CAUSING_EVENT_IDS]) <= 8000
    assert kept == ids[-len(kept) :]
    assert tags[naming.TAG_CAUSING_EVENT_IDS_OMITTED] == str(200 - len(kept))


def test_a_few_causing_event_ids_are_all_kept():
    assert naming.causing_ids_tags(["a", "b"]) == {"tuneloop.causing_event_ids": '["a", "b"]'}
