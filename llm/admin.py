"""The console's model pages, each in its own module: local models (``catalog_admin``), model
roles (``roles_admin``), model drafts (``role_drafts_admin``) and model usage
(``usage_admin``, whose inline also lists each run's model calls on brain's run page).
Read-only: the llm app's services are the only writers; the pages' actions call them."""

from llm import (  # noqa: F401  (each registers its page)
    catalog_admin,
    role_drafts_admin,
    roles_admin,
    usage_admin,
)
