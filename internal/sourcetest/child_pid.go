package sourcetest

// Pid is the child's process id, e.g. to read its memory use from /proc.
func (c *Child) Pid() int { return c.cmd.Process.Pid }
