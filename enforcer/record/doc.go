// Package record keeps what nodeguard caches of an object, for every cache
// alike (Machines, InfraMachines, pools, Nodes): a Shape, which the link
// model derives, says which strings, string lists and conditions are kept and
// by which tuples records are found; a Record holds them in one string; and
// client-go indexes over the shape's tuples (Indexers, Find), in the same
// store as the records, find them by value. SplitKey parses the
// "namespace/name" keys the stores and nodeguard's flags name objects by.
package record
