"""The ``azure`` provider package.  For now it holds only the live price adapter
(``prices.fetch_prices``, registered under the ``flowmesh_sdk.price_sources`` entry points);
the provider driver itself is not written yet."""
