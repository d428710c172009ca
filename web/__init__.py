"""The browser viewer: static files (``index.html``, ``viewer.js``, ``viewer.css``, ``vendor/``) served by
``vostream serve`` (``docs/viewer.md``)."""
