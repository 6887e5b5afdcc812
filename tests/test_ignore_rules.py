"""The `exclude` rules that are plain directory names (the setting's default) are matched
without pathspec: held here to pathspec's own answer for any such rules and any path."""

from __future__ import annotations

import pathspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from durable_agent.workspace.ignore_rules import DirectoryNames, compile_checked

# Few characters, so that rules and path parts often coincide, or nearly (".a" and "a.").
PART = st.text(alphabet="ab._-", min_size=1, max_size=3)
NAME = PART.filter(lambda n: n not in (".", ".."))
RULES = st.lists(
    st.one_of(NAME.map(lambda n: n + "/"), st.sampled_from(["", "  ", "# a/ comment"])), max_size=6
)
PATHS = st.tuples(
    st.lists(
        st.one_of(PART, st.sampled_from(["node_modules", ".git", "é", "\udcff"])),
        min_size=1,
        max_size=5,
    ),
    st.booleans(),
).map(lambda t: "/".join(t[0]) + ("/" if t[1] else ""))


@pytest.mark.slow  # over 2 s on 2 cores
@settings(max_examples=400, deadline=None)
@given(rules=RULES, paths=st.lists(PATHS, min_size=1, max_size=8))
def test_plain_directory_rules_match_as_pathspec_matches_them(
    rules: list[str], paths: list[str]
) -> None:
    ours = compile_checked(rules)[0]
    assert isinstance(ours, DirectoryNames)  # the case under test: no pathspec behind it
    theirs = pathspec.GitIgnoreSpec.from_lines(rules, backend="simple")
    for path in paths:
        assert ours.check_file(path).include == theirs.check_file(path).include, (rules, path)


def test_the_default_exclude_rules_take_the_plain_path_and_any_other_rule_takes_pathspec() -> None:
    from durable_agent.config.settings import Settings

    assert isinstance(compile_checked(Settings().exclude)[0], DirectoryNames)
    for other in (
        ["*.log"],
        ["build"],
        ["/build/"],
        ["a/b/"],
        ["!keep/"],
        ["./"],
        ["../"],
        ["a /"],
        ["\\#a/"],
        ["node_modules/", "dist/*"],
    ):
        spec = compile_checked(other)[0]
        assert not isinstance(spec, DirectoryNames), other
