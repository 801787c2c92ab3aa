"""The version of ``good`` this directory builds, and the label its ConfigMaps carry."""

VERSION = "0.1.0"
LABEL = "v1"
