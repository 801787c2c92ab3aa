"""The version of ``good`` this directory builds, and the label its ConfigMaps carry."""

VERSION = "0.2.0"
LABEL = "v2"
