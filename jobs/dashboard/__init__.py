"""The dashboard: its figures (``figures``, pure), its reads (``reads``), the recent refusals
it counts (``refusals``) and the page's static files (``static/``)."""
