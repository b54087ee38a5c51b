from django.urls import path

from accounts.schema_views import docs_view, schema_view

urlpatterns = [
    path("schema/", schema_view, name="api-schema"),
    path("docs/", docs_view, name="api-docs"),
]
