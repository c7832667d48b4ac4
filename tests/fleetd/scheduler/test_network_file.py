"""Slurm topology files (tree and block forms, host ranges) read into network places."""

import pytest

from fleetd.scheduler import NetworkPlace
from fleetd.scheduler.network_file import (
    TopologyFileError,
    expand_hostlist,
    parse_topology,
    place_of,
)

TREE = """
# a three-level tree: leaves under two aggregation switches under one core
SwitchName=leaf1 Nodes=gpu[001-004]
SwitchName=leaf2 Nodes=gpu[005-008] LinkSpeed=400
SwitchName=leaf3 Nodes=gpu[009-010],cpu1
SwitchName=agg1 Switches=leaf[1-2]
SwitchName=agg2 Switches=leaf3
SwitchName=core Switches=agg[1-2]
"""


def test_host_ranges_expand_with_their_padding_lists_and_several_brackets():
    assert expand_hostlist("gpu[001-003]") == ["gpu001", "gpu002", "gpu003"]
    assert expand_hostlist("n[1-2,7],login") == ["n1", "n2", "n7", "login"]
    assert expand_hostlist("r[1-2]-g[08-09]") == ["r1-g08", "r1-g09", "r2-g08", "r2-g09"]
    assert expand_hostlist("plain.example.org") == ["plain.example.org"]


@pytest.mark.parametrize("bad", ["gpu[3-1]", "gpu[1-2", "gpu]1[", "gpu[a-b]", "a,,b", "g[[1]]"])
def test_malformed_host_lists_are_refused(bad):
    with pytest.raises(ValueError):
        expand_hostlist(bad)


def test_a_host_range_larger_than_the_cap_is_refused():
    with pytest.raises(ValueError, match="more than"):
        expand_hostlist("n[0-99999999]")


def test_the_tree_form_gives_leaf_block_below_the_spine_and_spine():
    places = parse_topology(TREE)
    assert places["gpu001"] == NetworkPlace(block="agg1", leaf="leaf1", spine="core")
    assert places["gpu008"] == NetworkPlace(block="agg1", leaf="leaf2", spine="core")
    assert places["cpu1"] == NetworkPlace(block="agg2", leaf="leaf3", spine="core")
    assert len(places) == 11


def test_a_two_level_tree_makes_each_leaf_a_block_and_one_switch_is_all_three_or_none():
    two = parse_topology(
        "SwitchName=s1 Nodes=a[1-2]\nSwitchName=s2 Nodes=b1\nSwitchName=top Switches=s[1-2]"
    )
    assert two["a1"] == NetworkPlace(block="s1", leaf="s1", spine="top")
    one = parse_topology("switchname=only nodes=h1")
    assert one["h1"] == NetworkPlace(block="only", leaf="only", spine=None)


def test_the_block_form_gives_blocks_only_and_ignores_block_sizes():
    places = parse_topology(
        "BlockName=b1 Nodes=gpu[01-18]\nBlockName=b2 Nodes=gpu[19-36]\nBlockSizes=4,16"
    )
    assert places["gpu18"] == NetworkPlace(block="b1") and places["gpu19"].block == "b2"
    assert len(places) == 36


@pytest.mark.parametrize(
    "text, line_no, words",
    [
        ("SwitchName=s1 Nodes=a1\nSwitchName=s2 Switches=s9", 2, "s9 is not defined"),
        ("SwitchName=s1 Nodes=a1\nBlockName=b1 Nodes=a2", 2, "not both"),
        ("SwitchName=s1 Nodes=a1\nSwitchName=s2 Nodes=a1", 2, "already placed on line 1"),
        ("Frobnicate=yes", 1, "expected SwitchName"),
        ("SwitchName=s1 Nodes=gpu[2-1]", 1, "runs backwards"),
        ("SwitchName=s1", 1, "needs Nodes= or Switches="),
        ("SwitchName=s1 Nodes=a1 Switches=s2", 1, "not both"),
        ("\n\nBlockName=b1 Nodes=a1 Color=red", 3, "unknown key"),
        ("SwitchName=s1 Nodes", 1, "not Key=Value"),
        ("SwitchName=s1 Nodes=a1\nSwitchName=s1 Nodes=a2", 2, "defined twice"),
        ("SwitchName=a Switches=b\nSwitchName=b Switches=a\nSwitchName=c Nodes=h", 1, "loop"),
    ],
)
def test_a_wrong_line_is_named_with_its_number_and_what_is_wrong(text, line_no, words):
    with pytest.raises(TopologyFileError) as caught:
        parse_topology(text)
    assert caught.value.line_no == line_no and words in str(caught.value)
    assert f"line {line_no}:" in str(caught.value)


def test_a_loop_of_switches_above_a_leaf_is_refused():
    text = "SwitchName=leaf Nodes=h1\nSwitchName=a Switches=leaf,b\nSwitchName=b Switches=a"
    with pytest.raises(TopologyFileError, match="already under|loop"):
        parse_topology(text)


def test_labels_win_over_the_file_whole_and_the_short_hostname_matches():
    places = parse_topology(TREE)
    assert place_of("gpu001.cluster.local", {}, places) == places["gpu001"]
    labelled = place_of("gpu001", {"topology.fleetd/block": "nvl72-a"}, places)
    assert labelled == NetworkPlace(block="nvl72-a")
    assert place_of("elsewhere", {}, places) is None
    assert place_of("gpu001", {}, None) is None
