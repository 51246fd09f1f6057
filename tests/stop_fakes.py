"""Stop requests that record what a task would do instead of doing it (tests of stops and the
stall watch)."""

from ps_trainer.faults import stops


class RecordingStop(stops.StopRequest):
  """A StopRequest whose forced exit is recorded instead of ending the process."""

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self.forced = []

  def force_exit(self, reason, status, resorts=None):
    self.forced.append((reason, status))


class RestartingStop(RecordingStop):
  """A RecordingStop whose restarts are recorded too."""

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self.restarts = []

  def restart(self, reason, execv=None):
    self.restarts.append(reason)
