"""The UI's front door: every page runs behind `require_user` (see triage/ui/auth.py)."""

from __future__ import annotations

from collections.abc import Mapping

import streamlit as st

from triage.ui.auth import UiConfigError, UiSettings
from triage.ui.text import md_escape


def request_identity() -> tuple[Mapping[str, str], str | None]:
    """The request's headers and the peer address (None on Streamlit's loopback socket)."""
    return st.context.headers, st.context.ip_address


def settings() -> UiSettings:
    """The settings `triage ui` handed over; a bad value stops every page with its message."""
    try:
        return UiSettings.from_env()
    except UiConfigError as exc:
        st.error(md_escape(str(exc)))
        st.stop()
        raise  # st.stop raises; keeps type checkers and readers sure


def require_user(ui: UiSettings) -> str | None:
    """The signed-in user's name, or None without authentication (loopback only).

    Stops the page (login button, or an error) when the request is not authenticated.
    """
    if ui.auth == "oidc":
        if not st.user.get("is_logged_in", False):
            st.title("triage")
            st.write("Log in to use the incident knowledge base.")
            st.button("Log in", type="primary", on_click=st.login)
            st.stop()
        name = str(st.user.get("email") or st.user.get("name") or "signed-in user")
        st.sidebar.caption(md_escape(f"Signed in as {name}"))
        st.sidebar.button("Log out", on_click=st.logout)
        return name
    if ui.auth == "header":
        headers, ip = request_identity()
        if not ui.proxy_trusted(ip):
            st.error("This UI only accepts requests through its authenticating proxy.")
            st.stop()
        user = (headers.get(ui.header) or "").strip()
        if not user:
            st.error(md_escape(f"Not authenticated: the proxy sent no {ui.header} header."))
            st.stop()
        st.sidebar.caption(md_escape(f"Signed in as {user}"))
        return user
    return None
