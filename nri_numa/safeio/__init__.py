"""The bottom layer for what nri-numa does not control: text measured before it is parsed
(bounds, YAML and JSON documents, checkpoint JSON) and files opened without following links.
It imports nothing else of nri-numa's, so every package, the hook's thin client included, can
use it."""
