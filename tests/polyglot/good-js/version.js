// The version of `good` this directory builds, and the label its
// ConfigMaps carry.
export const VERSION = '0.1.0';
export const LABEL = 'v1';
