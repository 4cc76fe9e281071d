"""The local Kafka's configuration, version choice and jar cache, without starting a broker.

Maven is replaced by a small shell script on PATH where a test is about what prepare_kafka()
does with Maven's outcome; the real resolution runs in `make services` and the integration
tests.
"""

from __future__ import annotations

import base64
import os
import stat
from pathlib import Path

import pytest

from devservices import kafka
from devservices.kafka import (
    KafkaUnavailableError,
    LocalKafka,
    broker_command,
    candidate_versions,
    parse_kafka_version,
    prepare_kafka,
    prepared_libs,
    render_server_properties,
)
from orchestrator.errors import ConfigError


def _properties(text: str) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in text.splitlines() if line and line[0] != "#")
    return {key: value for key, value in pairs}


def _render(version: str = "3.9.2") -> dict[str, str]:
    return _properties(
        render_server_properties(
            version=version, port=19092, controller_port=19093, data_dir=Path("/data/kafka")
        )
    )


# --- server.properties -----------------------------------------------------------------------


def test_broker_and_controller_listen_on_loopback_only() -> None:
    props = _render()

    assert props["listeners"] == "PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:19092"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:19093"


def test_one_node_runs_both_roles_with_a_static_quorum() -> None:
    props = _render()

    assert props["process.roles"] == "broker,controller"
    assert props["node.id"] == "1"
    assert props["controller.listener.names"] == "CONTROLLER"
    assert props["inter.broker.listener.name"] == "PLAINTEXT"
    assert "controller.quorum.bootstrap.servers" not in props


def test_every_replication_factor_and_min_isr_is_one() -> None:
    props = _render()

    for key in (
        "default.replication.factor",
        "min.insync.replicas",
        "offsets.topic.replication.factor",
        "transaction.state.log.replication.factor",
        "transaction.state.log.min.isr",
    ):
        assert props[key] == "1", key


def test_internal_topics_have_one_partition_so_first_joins_are_quick() -> None:
    props = _render()

    assert props["offsets.topic.num.partitions"] == "1"
    assert props["transaction.state.log.num.partitions"] == "1"
    assert props["num.partitions"] == "1"
    assert props["group.initial.rebalance.delay.ms"] == "0"


def test_topics_are_created_on_first_use() -> None:
    assert _render()["auto.create.topics.enable"] == "true"


def test_a_crashed_broker_is_let_back_in_after_six_seconds_with_heartbeats_every_second() -> None:
    props = _render()

    assert props["broker.session.timeout.ms"] == "6000"
    assert props["broker.heartbeat.interval.ms"] == "1000"


def test_data_lives_in_the_given_directory() -> None:
    assert _render()["log.dirs"] == "/data/kafka"


def test_share_coordinator_settings_are_written_for_kafka_4_only() -> None:
    assert "share.coordinator.state.topic.replication.factor" not in _render("3.9.2")

    props = _render("4.1.0")
    assert props["share.coordinator.state.topic.replication.factor"] == "1"
    assert props["share.coordinator.state.topic.min.isr"] == "1"


def test_no_key_is_written_twice() -> None:
    text = render_server_properties(version="4.1.0", port=1, controller_port=2, data_dir=Path("/d"))
    keys = [line.split("=", 1)[0] for line in text.splitlines() if line and line[0] != "#"]

    assert len(keys) == len(set(keys))


def test_an_override_replaces_its_key_in_place_and_a_new_key_is_appended() -> None:
    text = render_server_properties(
        version="3.9.2",
        port=1,
        controller_port=2,
        data_dir=Path("/d"),
        overrides={"num.partitions": "3", "log.retention.hours": "1"},
    )
    keys = [line.split("=", 1)[0] for line in text.splitlines() if line and line[0] != "#"]
    props = _properties(text)

    assert props["num.partitions"] == "3"
    assert keys.count("num.partitions") == 1
    assert keys[-1] == "log.retention.hours"
    assert props["log.retention.hours"] == "1"


# --- versions ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [("3.9.2", (3, 9, 2)), ("4.1.0", (4, 1, 0)), (" 3.9.1 ", (3, 9, 1))],
    ids=["3.9", "4.x", "surrounding-spaces"],
)
def test_release_numbers_parse(text: str, expected: tuple[int, int, int]) -> None:
    assert parse_kafka_version(text) == expected


@pytest.mark.parametrize(
    "text",
    ["latest", "3.9", "3.9.2-rc1", "v3.9.2", ""],
    ids=["word", "two-parts", "rc", "v", "empty"],
)
def test_a_malformed_version_is_refused_with_its_value_named(text: str) -> None:
    with pytest.raises(ConfigError, match="not an Apache Kafka release number"):
        parse_kafka_version(text)


def test_a_release_without_production_kraft_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"too old .* 3\.5 or newer"):
        parse_kafka_version("3.4.1")


def test_without_kafka_version_the_defaults_are_tried_newest_patch_first() -> None:
    assert candidate_versions({}) == ("3.9.2", "3.9.1")
    assert candidate_versions({"KAFKA_VERSION": "  "}) == ("3.9.2", "3.9.1")


def test_kafka_version_selects_exactly_that_release() -> None:
    assert candidate_versions({"KAFKA_VERSION": "4.1.0"}) == ("4.1.0",)


def test_a_bad_kafka_version_fails_before_anything_is_downloaded() -> None:
    with pytest.raises(ConfigError, match="KAFKA_VERSION='four'"):
        candidate_versions({"KAFKA_VERSION": "four"})


# --- the cache ------------------------------------------------------------------------------


def test_the_cache_root_honours_tuneloop_cache(tmp_path: Path) -> None:
    assert kafka.cache_root({"TUNELOOP_CACHE": str(tmp_path)}) == tmp_path
    assert kafka.cache_root({}) == Path.home() / ".cache" / "tuneloop"


def _fake_mvn(bin_dir: Path, *, succeed_for: set[str]) -> Path:
    """A stand-in for mvn: logs its arguments; 'resolves' only the listed versions."""
    calls = bin_dir / "mvn-calls"
    script = bin_dir / "mvn"
    versions = " ".join(sorted(succeed_for))
    script.write_text(
        "#!/bin/sh\nPATH=/usr/bin:/bin\n"
        f'echo "$@" >> "{calls}"\n'
        'for arg in "$@"; do case "$arg" in\n'
        "  -Dkafka.version=*) version=${arg#-Dkafka.version=} ;;\n"
        "  -DoutputDirectory=*) out=${arg#-DoutputDirectory=} ;;\n"
        "esac; done\n"
        f'for ok in {versions}; do if [ "$ok" = "$version" ]; then\n'
        '  mkdir -p "$out" && touch "$out/kafka_2.13-$version.jar" "$out/kafka-clients.jar"\n'
        "  exit 0\n"
        "fi; done\n"
        'echo "Could not resolve org.apache.kafka:kafka_2.13:$version" >&2\n'
        "exit 1\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return calls


@pytest.fixture
def isolated_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "cache"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("TUNELOOP_CACHE", str(cache))
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.delenv("KAFKA_VERSION", raising=False)
    return cache


def test_resolved_jars_are_moved_into_place_and_marked_complete(isolated_cache: Path) -> None:
    calls = _fake_mvn(Path(os.environ["PATH"]), succeed_for={"3.9.2"})

    libs = prepare_kafka()

    assert libs == isolated_cache / "kafka-3.9.2" / "libs"
    assert (libs / "kafka_2.13-3.9.2.jar").is_file()
    assert "kafka_2.13-3.9.2.jar" in (libs.parent / "libs.complete").read_text()
    assert not list(libs.parent.glob("libs.partial-*"))
    arguments = calls.read_text()
    assert f"-Dmaven.repo.local={isolated_cache / 'm2'}" in arguments
    assert "maven-dependency-plugin:3.8.1:copy-dependencies" in arguments
    assert "-DincludeScope=runtime" in arguments


def test_a_second_prepare_does_not_run_maven_again(isolated_cache: Path) -> None:
    calls = _fake_mvn(Path(os.environ["PATH"]), succeed_for={"3.9.2"})
    first = prepare_kafka()

    second = prepare_kafka()

    assert second == first
    assert len(calls.read_text().splitlines()) == 1


def test_when_3_9_2_does_not_resolve_3_9_1_is_used(isolated_cache: Path) -> None:
    calls = _fake_mvn(Path(os.environ["PATH"]), succeed_for={"3.9.1"})

    libs = prepare_kafka()

    assert libs == isolated_cache / "kafka-3.9.1" / "libs"
    assert len(calls.read_text().splitlines()) == 2
    assert prepared_libs("3.9.2", cache=isolated_cache) is None


def test_an_unresolvable_version_fails_with_maven_s_own_words(
    isolated_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_mvn(Path(os.environ["PATH"]), succeed_for=set())
    monkeypatch.setenv("KAFKA_VERSION", "4.9.9")

    with pytest.raises(KafkaUnavailableError, match=r"Could not resolve .*kafka_2.13:4.9.9"):
        prepare_kafka()
    assert prepared_libs("4.9.9", cache=isolated_cache) is None


def test_a_partial_download_never_counts_as_prepared(isolated_cache: Path) -> None:
    libs = isolated_cache / "kafka-3.9.2" / "libs"
    libs.mkdir(parents=True)
    (libs / "kafka_2.13-3.9.2.jar").touch()  # jars, but no completion marker

    assert prepared_libs("3.9.2", cache=isolated_cache) is None
    # No mvn on PATH: a partial folder must lead to a new resolution, which cannot run here.
    with pytest.raises(KafkaUnavailableError, match="`mvn` is not on PATH"):
        prepare_kafka("3.9.2")


def test_a_complete_cache_needs_no_maven_at_all(isolated_cache: Path) -> None:
    home = isolated_cache / "kafka-3.9.2"
    (home / "libs").mkdir(parents=True)
    (home / "libs" / "kafka_2.13-3.9.2.jar").touch()
    (home / "libs.complete").write_text("kafka_2.13-3.9.2.jar\n")

    assert prepare_kafka() == home / "libs"


# --- the broker's process, before it runs -------------------------------------------------------


def test_cluster_ids_have_kafka_s_uuid_form() -> None:
    for _ in range(200):
        cluster_id = kafka.new_cluster_id()
        assert len(cluster_id) == 22
        assert not cluster_id.startswith("-")
        assert len(base64.urlsafe_b64decode(cluster_id + "==")) == 16


def test_the_broker_jvm_gets_a_small_heap_the_classpath_and_the_properties() -> None:
    command = broker_command(
        java="/usr/bin/java",
        libs=Path("/c/libs"),
        properties=Path("/w/server.properties"),
        heap="512m",
        class_archive=("-XX:SharedArchiveFile=/c/broker.jsa",),
    )

    assert command[0] == "/usr/bin/java"
    assert "-Xmx512m" in command
    assert command[command.index("-cp") + 1] == "/c/libs/*"
    assert command[-2:] == ["kafka.Kafka", "/w/server.properties"]
    assert "-XX:SharedArchiveFile=/c/broker.jsa" in command


def test_a_broker_keeps_two_distinct_loopback_ports_before_it_starts(tmp_path: Path) -> None:
    libs = tmp_path / "libs"
    libs.mkdir()
    (libs / "kafka_2.13-3.9.2.jar").touch()

    broker = LocalKafka(libs=libs, work_dir=tmp_path / "work")

    assert broker.version == "3.9.2"
    assert broker.bootstrap == f"127.0.0.1:{broker.port}"
    assert broker.port != broker.controller_port
    assert not broker.running
    assert "no log" in broker.log_tail()
    broker.stop()  # stopping a broker that never started is a no-op


def test_docker_can_be_ruled_out_without_asking_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNELOOP_KAFKA_DOCKER", "0")

    assert kafka.docker_answers() is False


def test_broker_ports_are_free_distinct_and_below_the_ephemeral_range() -> None:
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])

    ports = kafka.free_ports(2)

    assert len(set(ports)) == 2
    assert all(port < low for port in ports)


def test_the_command_line_names_its_commands_when_given_another(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert kafka.main(["start"]) == 2
    assert "prepare|run" in capsys.readouterr().err
