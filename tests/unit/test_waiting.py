"""powerfleet.testing.waiting.wait_for: what its timeout message says about the tries."""

from __future__ import annotations

import pytest

from powerfleet.testing.waiting import wait_for


def test_a_timeout_says_the_last_try_returned_nothing_after_an_earlier_one_raised() -> None:
    """As with issue 31's ping: the first try raises (a connection to a killed master), every
    later one answers with nothing. The message must not read as if each try raised."""
    tries = iter([ConnectionError("Connection closed by server.")])

    def probe() -> list[str]:
        exc = next(tries, None)
        if exc is not None:
            raise exc
        return []

    with pytest.raises(AssertionError) as err:
        wait_for(probe, "a worker to answer ping", timeout_s=0.2, every_s=0.01)
    message = str(err.value)
    assert "(last try returned []; 1 of " in message, message
    assert "tries raised, the last of them ConnectionError('Connection closed by server.')" in message, message


def test_a_timeout_whose_last_try_raised_names_that_error() -> None:
    def probe() -> bool:
        raise OSError("refused")

    with pytest.raises(AssertionError) as err:
        wait_for(probe, "a port", timeout_s=0.05, every_s=0.01)
    assert str(err.value).endswith("waiting for a port (last try raised OSError('refused'))"), err.value


def test_the_first_truthy_value_is_returned() -> None:
    values = iter([None, 0, "ready"])
    assert wait_for(lambda: next(values), "a value", timeout_s=5, every_s=0) == "ready"
