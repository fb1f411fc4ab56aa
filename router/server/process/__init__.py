"""Running the router: serving its application on the listening sockets, alone or as workers under a supervisor, and stopping it."""
