"""Load on servers: CPU pinning and accounting (cpu), the load generators (clients), the servers
under load (servers), and the timed runs, rounds and comparisons every load section uses (runs)."""
