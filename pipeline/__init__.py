"""vostream's dataflow engine: stages in threads joined by bounded queues."""
